"""Which optimizer kernel each precision's loss scaler can drive, checked with torch's real scalers, and where the
gradients are scaled."""

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
    with precision.scaled((weight * 2).sum(), optimizer, last=True) as scaled:
        scaled.backward()
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


@pytest.mark.parametrize("last", [True, False])
def test_gradients_stay_scaled_inside_and_are_unscaled_as_the_last_micro_step_leaves(last):
    """What runs inside `scaled` after backward (Horovod's synchronize) sees the scaled gradients, before anything
    unscales them; leaving after the step's last micro-step unscales them for clipping, and leaving after an
    earlier one (the control) leaves them scaled for the next micro-step to add to."""
    precision = Precision("fp16", torch.device("cpu"), sharded=False)
    weight = torch.nn.Parameter(torch.ones(4))
    optimizer = torch.optim.AdamW([weight], lr=0.1)
    scale = precision.scaler.get_scale()
    with precision.scaled((weight * 2).sum(), optimizer, last=last) as scaled:
        scaled.backward()
        inside = weight.grad.clone()
    assert torch.equal(inside, torch.full((4,), 2.0 * scale))
    assert torch.equal(weight.grad, torch.full((4,), 2.0) if last else inside)
