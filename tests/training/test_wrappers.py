"""The data-parallel wrappers' settings, checked by what they change on real 2-rank gloo groups, each beside
torch's defaults as the control: DDP's gradients live in its all-reduce buckets (no copy after each
all-reduce), and FSDP's last block is not gathered a second time at the start of backward."""

from __future__ import annotations

import contextlib

import pytest
import torch
from test_communication import MODEL, gloo_rank
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel

from gpt2dist.training.model import TokenLoss, build_model, lm_loss, transformer_blocks
from gpt2dist.training.strategies.ddp import data_parallel
from gpt2dist.training.strategies.fsdp import shard_fully

from conftest import RANKS, free_port, start_ranks

pytestmark = pytest.mark.timeout(180)


def _grad_storages(model: torch.nn.Module, inputs: torch.Tensor) -> tuple[int, int]:
    lm_loss(TokenLoss(model, contextlib.nullcontext), inputs, inputs).backward()
    grads = [p.grad for p in model.parameters()]
    return len({g.untyped_storage().data_ptr() for g in grads}), len(grads)


def _all_gathers(model: torch.nn.Module, inputs: torch.Tensor) -> int:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as trace:
        lm_loss(TokenLoss(model, contextlib.nullcontext), inputs, inputs).backward()
    return sum(event.name.startswith("c10d::_allgather_base_") for event in trace.events())


def _rank(rank: int, port: int, results) -> None:
    with gloo_rank(rank, port):
        inputs = torch.randint(0, MODEL.vocab_size, (2, MODEL.n_positions))
        ours = _grad_storages(data_parallel(build_model(MODEL, seed=0), torch.device("cpu")), inputs)
        default = _grad_storages(DistributedDataParallel(build_model(MODEL, seed=0)), inputs)
        sharded = build_model(MODEL, seed=0)
        shard_fully(sharded, mesh=None)
        plain = build_model(MODEL, seed=0)
        for module in (*transformer_blocks(plain), plain):
            fully_shard(module)
            module.set_force_sum_reduction_for_comms(True)
        gathers = (_all_gathers(sharded, inputs), _all_gathers(plain, inputs))
        if rank == 0:
            results.put((ours, default, gathers))


def test_ddp_gradients_are_bucket_views_and_fsdp_gathers_the_last_block_once():
    results = RANKS.SimpleQueue()
    start_ranks(_rank, free_port(), results, nprocs=2)
    (ours, count), (default, _), (gathers, plain_gathers) = results.get()
    assert ours < count  # the tiny model's gradients share its few buckets' storage
    assert default == count  # control: torch's default keeps a separate tensor per gradient, copied into
    # forward gathers the root and every block; backward again every block but the last
    assert gathers == 1 + MODEL.n_layer + (MODEL.n_layer - 1)
    assert plain_gathers == gathers + 1  # control: by default the last block is gathered twice in a row
