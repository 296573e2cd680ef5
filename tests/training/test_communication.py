"""The traffic model against what the strategies really send: DDP's all-reduced gradient buckets
counted by a communication hook, and tensor parallelism's collectives counted by DTensor's
CommDebugMode, on real 2-rank gloo groups."""

from __future__ import annotations

import contextlib
import os

import pytest
import torch
import torch.distributed as dist

from gpt2dist.config.schema import ModelConfig, RunSpec, TrainConfig
from gpt2dist.config.sizes import parameter_count, split_parameter_count
from gpt2dist.config.traffic import traffic
from gpt2dist.training.model import TokenLoss, build_model, lm_loss
from gpt2dist.training.strategies.tensor_parallel import shard_blocks

from conftest import RANKS, TINY_PRESET, free_port, start_ranks

MODEL = ModelConfig(**TINY_PRESET["model"])
TRAIN = TrainConfig(**TINY_PRESET["train"])


def spec(strategy: str, nproc: int, precision: str = "fp32", **train) -> RunSpec:
    return RunSpec(data_dir="", out_dir="", preset="tiny", strategy=strategy, precision=precision, nproc=nproc,
                   device="cpu", model=MODEL, train=TRAIN.model_copy(update=train))


def test_parameter_counts_match_the_built_model():
    model = build_model(MODEL, seed=0)
    assert parameter_count(MODEL) == sum(p.numel() for p in model.parameters())  # tied head counted once
    split = ("attn.c_attn.weight", "attn.c_attn.bias", "c_fc.weight", "c_fc.bias", "c_proj.weight")
    assert split_parameter_count(MODEL) == sum(p.numel() for n, p in model.named_parameters() if n.endswith(split))


def test_the_model_follows_each_strategys_collectives():
    params = parameter_count(MODEL)
    assert traffic(spec("single", 1)).bytes_per_step == 0 and traffic(spec("ddp", 1)).bytes_per_step == 0
    assert traffic(spec("ddp", 2)).bytes_per_step == params * 4  # 2(n-1)/n of the fp32 gradients
    assert traffic(spec("horovod", 4)).bytes_per_step == round(1.5 * params * 4)
    # FSDP gathers the parameters twice per micro-step (2 micro-steps here) and reduce-scatters once
    assert traffic(spec("fsdp", 2)).bytes_per_step == round((2 * 2 * 0.5 + 0.5) * params * 4)
    # bf16 activations halve tensor parallelism's traffic; a pipeline sends activations, not gradients
    assert traffic(spec("tp", 2, "bf16")).bytes_per_step * 2 == traffic(spec("tp", 2)).bytes_per_step
    micro_batches, boundary = 8 // 2, 2 * MODEL.n_positions * MODEL.n_embd * 4  # per micro-batch, fp32
    tied = MODEL.vocab_size * MODEL.n_embd * 4
    assert traffic(spec("pp", 2)).bytes_per_step == micro_batches * boundary + tied


@contextlib.contextmanager
def gloo_rank(rank: int, port: int):
    """This process as one of 2 gloo ranks on one thread, its group destroyed on the way out."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.set_num_threads(1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _count_rank(rank: int, port: int, results) -> None:
    with gloo_rank(rank, port):
        inputs = torch.randint(0, MODEL.vocab_size, (2, MODEL.n_positions))
        # DDP: every gradient byte passes through the communication hook once per step
        sent = []

        def counting_hook(state, bucket):
            sent.append(bucket.buffer().numel() * bucket.buffer().element_size())
            return dist.all_reduce(bucket.buffer(), async_op=True).get_future().then(lambda f: f.value()[0])

        ddp = torch.nn.parallel.DistributedDataParallel(build_model(MODEL, seed=0))
        ddp.register_comm_hook(None, counting_hook)
        lm_loss(TokenLoss(ddp, contextlib.nullcontext), inputs, inputs).backward()
        # tp: collectives per micro-step, counted by DTensor
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.debug import CommDebugMode

        model = build_model(MODEL, seed=0)
        shard_blocks(model, init_device_mesh("cpu", (2,)))
        with CommDebugMode() as comm:
            lm_loss(TokenLoss(model, contextlib.nullcontext), inputs, inputs).backward()
        if rank == 0:
            results.put((sum(sent), comm.get_total_counts()))


@pytest.mark.slow  # traced ddp and tp runs
@pytest.mark.timeout(120)
def test_the_modelled_payloads_are_what_ddp_and_tp_send():
    results = RANKS.SimpleQueue()
    start_ranks(_count_rank, free_port(), results, nprocs=2)
    ddp_bytes, tp_collectives = results.get()
    assert ddp_bytes == parameter_count(MODEL) * 4  # the payload the ring all-reduce model is applied to
    assert tp_collectives == 4 * MODEL.n_layer  # two all-reduces per block forward, two backward
