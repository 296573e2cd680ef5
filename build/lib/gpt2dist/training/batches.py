"""Per-rank batches. A batch is a pure function of (seed, split, step): the global batch of
a step is the same for every strategy and world size, and each rank takes a disjoint
contiguous slice of it. That is what makes loss curves comparable across strategies, and
it makes resuming trivial: the data position is the step number."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch

from gpt2dist.errors import UsageError

_STREAM = {"train": 0, "val": 1}


class BatchSampler:
    """Deals out the rows of each global batch: rank r of w gets rows [r*B/w, (r+1)*B/w)."""

    def __init__(self, tokens: np.ndarray, split: str, context: int, global_batch: int, seed: int, *,
                 pin_memory: bool = False):
        if len(tokens) < context + 2:
            raise UsageError(
                f"the '{split}' split has {len(tokens)} tokens, fewer than one sequence of "
                f"{context + 1}; prepare more data or lower model.n_positions"
            )
        self.tokens, self.split, self.context = tokens, split, context
        self.global_batch, self.seed = global_batch, seed
        # pinned (page-locked) batches let a non_blocking copy to CUDA be queued instead of
        # waiting for the GPU work ahead of it; pinning needs CUDA, so it is off on CPU
        self.pin_memory = pin_memory

    def offsets(self, step: int) -> np.ndarray:
        rng = np.random.default_rng([self.seed, _STREAM[self.split], step])
        return rng.integers(0, len(self.tokens) - self.context - 1, size=self.global_batch)

    def micro_batches(
        self, step: int, rank: int, world_size: int, rows_per_micro: int
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """(inputs, targets) contiguous int64 tensors of shape [rows_per_micro, context], this rank's share.

        Contiguous, because copying a strided view to CUDA stages it through pageable memory."""
        per_rank = self.global_batch // world_size
        mine = self.offsets(step)[rank * per_rank : (rank + 1) * per_rank]
        span = self.context + 1
        for start in range(0, per_rank, rows_per_micro):
            rows = np.stack([self.tokens[o : o + span] for o in mine[start : start + rows_per_micro]]).astype(np.int64)
            pair = tuple(torch.from_numpy(np.ascontiguousarray(part)) for part in (rows[:, :-1], rows[:, 1:]))
            yield tuple(t.pin_memory() for t in pair) if self.pin_memory else pair
