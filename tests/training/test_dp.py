"""DataParallel's loss module: each replica computes its own loss under the run's autocast dtype,
and the global mean is exact however the batch is chunked. GPU twins live in test_gpu.py."""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.nn.functional as F

from gpt2dist.config.presets import load_params
from gpt2dist.config.schema import ModelConfig
from gpt2dist.launch.runner import build_spec
from gpt2dist.training.loop import Trainer
from gpt2dist.training.model import TokenLoss, build_model, lm_loss, mean_loss
from gpt2dist.training.strategies import REGISTRY

from conftest import TINY_PRESET

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def dp_trainer(shards, params_file, out, precision: str) -> Trainer:
    spec = build_spec(data=shards, out=out, strategy="dp", precision=precision, nproc=1, params=load_params(params_file),
                      preset=None, overrides=[])
    return Trainer(spec, REGISTRY["dp"](spec))


def record_matmul_dtypes(model: torch.nn.Module) -> list[torch.dtype]:
    """Dtypes of the last block's last matrix product in every forward of `model` (also of its DataParallel
    replicas, which share hooks): what autocast made of the replica's linear layers."""
    seen = []
    model.transformer.h[-1].mlp.c_proj.register_forward_hook(lambda module, args, output: seen.append(output.dtype))
    return seen


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_dp_replica_computes_in_the_configured_dtype(precision, shards, params_file, tmp_path):
    # fp16 as well as bf16: a replica that fell back to autocast's default dtype fails one of the two
    trainer = dp_trainer(shards, params_file, tmp_path, precision)
    assert isinstance(trainer.loss, torch.nn.DataParallel)
    seen = record_matmul_dtypes(trainer.model)
    assert not torch.is_autocast_enabled("cpu")  # the loop enters no autocast around the replica
    line = trainer.train_step(0)
    assert seen == [DTYPES[precision]] * trainer.strategy.degrees.grad_accum_steps
    assert 0 < line["data_time_s"] <= line["step_time_s"]


def test_loss_module_gathers_only_sums_and_counts(shards, params_file, tmp_path):
    trainer = dp_trainer(shards, params_file, tmp_path, "fp32")
    inputs, targets = next(trainer.train_batches.micro_batches(0, 0, 1, trainer.rows))
    sums, counts = trainer.loss(inputs, targets)
    assert sums.shape == counts.shape == (1,) and counts.item() == targets.numel()
    hidden = trainer.model(inputs)
    logits = hidden @ trainer.model.transformer.wte.weight.T
    textbook = F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))
    assert lm_loss(trainer.loss, inputs, targets).item() == pytest.approx(textbook.item(), rel=1e-6)


def test_uneven_chunks_give_the_global_mean():
    """What DataParallel does with 3 rows over 2 GPUs (chunks of 2 and 1), done by hand on CPU."""
    loss = TokenLoss(build_model(ModelConfig(**TINY_PRESET["model"]), seed=0), contextlib.nullcontext)
    tokens = torch.randint(0, 512, (3, 33), generator=torch.Generator().manual_seed(0))
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    whole = lm_loss(loss, inputs, targets)
    parts = [loss(inputs[rows], targets[rows]) for rows in (slice(0, 2), slice(2, 3))]
    gathered = mean_loss(torch.cat([s for s, _ in parts]), torch.cat([c for _, c in parts]))
    assert gathered.item() == pytest.approx(whole.item(), rel=1e-6)
    mean_of_means = sum(s / c for s, c in parts) / 2
    assert mean_of_means.item() != pytest.approx(whole.item(), rel=1e-4)  # an unweighted mean would be caught
