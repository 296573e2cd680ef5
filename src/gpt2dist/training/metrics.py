"""Per-step metrics (metrics.jsonl) and the run record (run.json), written by rank 0 only.

`step` in every line counts the optimizer updates applied to the weights that produced
the measurement: a train line's loss at step k comes from weights after k updates, an
eval line at step k evaluates weights after k updates.
"""

from __future__ import annotations

import json
import resource
from pathlib import Path

import torch

from gpt2dist.io import atomic_write_text, out_of_disk, ran_out_of_disk


def peak_memory_bytes(device: torch.device) -> int:
    """Peak allocated CUDA memory, or this process's peak resident set on CPU."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux reports KiB


def peak_reserved(device: torch.device) -> dict:
    """The caching allocator's peak reservation (what other processes could not use), on CUDA."""
    return {"peak_reserved_bytes": int(torch.cuda.max_memory_reserved(device))} if device.type == "cuda" else {}


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """The part of a (possibly sharded) tensor this rank holds: a DTensor's local shard."""
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def _bytes(tensors, seen: set) -> int:
    total = 0
    for tensor in tensors:
        local = _local(tensor)
        key = (local.data_ptr(), local.numel(), local.dtype)
        if local.numel() and key not in seen:  # tied weights and shared views count once
            seen.add(key)
            total += local.numel() * local.element_size()
    return total


def model_state_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """Bytes of model state this rank holds, from the tensors themselves: parameters, gradients,
    and optimizer state (moments, plus master copies where the optimizer steps other tensors than
    the model holds, as Apex O2 does). Unlike peak RSS, this shows what sharding saves on CPU too.
    Communication buffers (DDP's buckets, Horovod's fusion buffer) are not counted."""
    seen: set = set()
    model_params = list(model.parameters())
    ids = {id(p) for p in model_params}
    optimizer_params = [p for group in optimizer.param_groups for p in group["params"]]
    masters = [p for p in optimizer_params if id(p) not in ids]
    params = _bytes(model_params, seen)
    grads = _bytes((p.grad for p in model_params + masters if p.grad is not None), seen)
    states = (v for state in optimizer.state.values() for v in state.values() if isinstance(v, torch.Tensor))
    optimizer_bytes = _bytes(masters, seen) + _bytes(states, seen)
    return {"params": params, "grads": grads, "optimizer": optimizer_bytes, "total": params + grads + optimizer_bytes}


class MetricsLog:
    """Append-only JSONL that remembers what it wrote, so a checkpoint can carry it. A resumed run
    starts the file from the checkpoint's history: lines measured after the checkpoint are dropped,
    and lines a workflow tool deleted with the file come back."""

    def __init__(self, path: Path, *, enabled: bool, history: list[dict]):
        self.path, self.enabled = path, enabled
        self.history = list(history)
        self._handle = None
        if not enabled:
            return
        atomic_write_text(path, "".join(json.dumps(record) + "\n" for record in self.history))
        self._handle = open(path, "a", buffering=1)

    def write(self, record: dict) -> None:
        if self._handle:
            self.history.append(record)
            try:
                self._handle.write(json.dumps(record) + "\n")
            except OSError as exc:
                if ran_out_of_disk(exc, self.path.parent):
                    raise out_of_disk(self.path, "The lines before it are kept") from exc
                raise

    def close(self) -> None:
        if self._handle:
            self._handle.close()

