"""FSDP's communication dtypes: fp32 by default (as DDP), FSDP2's MixedPrecisionPolicy on request."""

from __future__ import annotations

import pytest
from test_equivalence import MARGIN, divergence

from conftest import gpt2dist, gpu, read_metrics, run_record, train_args

pytestmark = pytest.mark.slow


def _fsdp_run(shards, params_file, out, precision, *extra, nproc=2):
    gpt2dist(*train_args(shards, params_file, out, "fsdp", *extra, nproc=nproc, precision=precision))
    return run_record(out), [line["loss"] for line in read_metrics(out)]


@pytest.mark.timeout(600)
def test_mixed_precision_policy_runs_and_is_recorded(single_in, shards, params_file, tmp_path):
    default, default_losses = _fsdp_run(shards, params_file, tmp_path / "default", "bf16")
    assert default["wrapping"] == {"fully_shard_modules": 3, "param_dtype": "float32", "reduce_dtype": "float32"}
    assert default["config"]["train"]["fsdp_mixed_precision"] is False

    mixed, mixed_losses = _fsdp_run(shards, params_file, tmp_path / "mixed", "bf16",
                                    "--set", "train.fsdp_mixed_precision=true")
    assert mixed["status"] == "completed" and mixed["config"]["train"]["fsdp_mixed_precision"] is True
    assert mixed["wrapping"] == {"fully_shard_modules": 3, "param_dtype": "bfloat16", "reduce_dtype": "float32"}
    assert mixed_losses[-1] < 0.9 * mixed_losses[0]
    # bf16 parameter copies change the arithmetic a little, not the training: within MARGIN times what bf16
    # autocast alone does to single's loss curve
    own = divergence(single_in("fp32"), single_in("bf16"))["loss"]
    gaps = [abs(a - b) / b for a, b in zip(mixed_losses, default_losses, strict=True)]
    assert 0 < max(gaps) < MARGIN * own, (max(gaps), own)


@pytest.mark.gpu
@gpu
@pytest.mark.timeout(600)
def test_mixed_precision_policy_on_gpu(shards, params_file, tmp_path):
    record, losses = _fsdp_run(shards, params_file, tmp_path, "bf16", "--set", "train.fsdp_mixed_precision=true",
                               nproc=1)
    assert record["wrapping"]["param_dtype"] == "bfloat16" and losses[-1] < losses[0]
