"""Which optimizer kernel each precision's loss scaler can drive, checked with torch's real scalers."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from gpt2dist.training.precision import Precision

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def one_rank_group(tmp_path):
    """ShardedGradScaler all-reduces found_inf, so it needs a process group (one gloo rank here)."""
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _scaled_step(precision: Precision, fused: bool) -> torch.Tensor:
    weight = torch.nn.Parameter(torch.ones(4))
    optimizer = torch.optim.AdamW([weight], lr=0.1, fused=fused)  # torch has a fused CPU kernel too
    precision.backward((weight * 2).sum(), optimizer, last=True, sync_grads=lambda: None)
    precision.step(optimizer)
    return weight.detach()


@pytest.mark.parametrize("sharded", [False, True], ids=["GradScaler", "ShardedGradScaler"])
def test_fused_optimizer_only_where_the_scaler_drives_it(sharded, one_rank_group):
    precision = Precision("fp16", torch.device("cpu"), sharded=sharded)
    assert precision.fused_optimizer is False  # the fused kernel is only chosen on CUDA
    foreach = _scaled_step(precision, fused=False)
    if precision.scaler_allows_fused_optimizer:
        assert torch.equal(_scaled_step(Precision("fp16", torch.device("cpu"), sharded=sharded), fused=True), foreach)
    else:  # the reason for the rule: if torch fixes this, drop the rule and this branch
        with pytest.raises(RuntimeError, match="doesn't match the broadcast shape"):
            _scaled_step(Precision("fp16", torch.device("cpu"), sharded=sharded), fused=True)
    assert not torch.equal(foreach, torch.ones(4))  # the step was taken
