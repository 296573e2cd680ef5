"""Per-rank batches: a pure function of (seed, split, step), each rank a disjoint slice."""

import numpy as np
import pytest

from gpt2dist.errors import UsageError
from gpt2dist.training.batches import BatchSampler


def test_ranks_partition_the_global_batch():
    tokens = np.arange(10_000, dtype=np.uint16)
    sampler = BatchSampler(tokens, "train", context=16, global_batch=8, seed=3)

    def rows(rank, world, per_micro):
        return [x[:, 0].tolist() for x, _ in sampler.micro_batches(5, rank, world, per_micro)]

    single = sum(rows(0, 1, 2), [])
    two = [sum(rows(r, 2, 2), []) for r in range(2)]
    four = [sum(rows(r, 4, 2), []) for r in range(4)]
    assert two[0] + two[1] == single and sum(four, []) == single  # disjoint, same global batch
    assert not set(two[0]) & set(two[1])
    x, y = next(sampler.micro_batches(5, 0, 1, 2))
    assert x.shape == (2, 16) and (y[:, :-1] == x[:, 1:]).all()  # targets are inputs shifted by one
    # a strided view would be staged through pageable memory on its way to CUDA
    assert x.is_contiguous() and y.is_contiguous() and not sampler.pin_memory


def test_batches_depend_on_seed_split_and_step():
    tokens = np.arange(10_000, dtype=np.uint16)
    a = BatchSampler(tokens, "train", 16, 8, seed=3)
    assert (a.offsets(1) == BatchSampler(tokens, "train", 16, 8, seed=3).offsets(1)).all()
    assert (a.offsets(1) != a.offsets(2)).any()
    assert (a.offsets(1) != BatchSampler(tokens, "val", 16, 8, seed=3).offsets(1)).any()


def test_split_shorter_than_a_sequence():
    with pytest.raises(UsageError, match="'val' split has 10 tokens, fewer than one sequence of 33"):
        BatchSampler(np.zeros(10, dtype=np.uint16), "val", context=32, global_batch=4, seed=0)
