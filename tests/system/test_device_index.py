"""Which GPU a rank drives: one rule for ddp, fsdp, horovod and the single-process strategies."""

import pytest

from gpt2dist.errors import UsageError
from gpt2dist.system.hardware import device_index


@pytest.mark.parametrize("local_rank", range(8))
def test_task_bound_to_one_gpu_uses_index_0(local_rank):
    # srun --gpus-per-task=1: every task sees its own GPU as cuda:0, local ranks 0..7
    assert device_index(local_rank, visible=1) == 0


def test_process_seeing_the_node_uses_its_local_rank():
    assert [device_index(rank, visible=8) for rank in range(8)] == list(range(8))


@pytest.mark.parametrize("local_rank, visible", [(2, 2), (8, 8), (5, 4)])
def test_more_ranks_than_visible_gpus(local_rank, visible):
    with pytest.raises(UsageError, match=rf"local rank {local_rank} has no GPU of its own: this process sees "
                                         rf"{visible} GPUs .*at most {visible} ranks per node"):
        device_index(local_rank, visible)


def test_no_visible_gpu():
    with pytest.raises(UsageError, match="no CUDA GPU is visible to this rank"):
        device_index(0, visible=0)
