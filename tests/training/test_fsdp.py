"""FSDP's communication dtypes: fp32 by default (as DDP), FSDP2's MixedPrecisionPolicy on request."""

from __future__ import annotations

import pytest
from test_equivalence import assert_follows_in_precision

from conftest import read_metrics, run_record, train_in_forked_ranks

pytestmark = pytest.mark.slow


def _fsdp_run(shards, params_file, out, precision, *extra, nproc=2):
    train_in_forked_ranks(shards, params_file, out, "fsdp", *extra, nproc=nproc, precision=precision)
    return run_record(out), [line["loss"] for line in read_metrics(out)]


@pytest.mark.timeout(600)
def test_mixed_precision_policy_runs_and_is_recorded(single_in, trained, shards, params_file, tmp_path):
    default = run_record(trained("fsdp", nproc=2, precision="fp16"))  # a reduced precision, without the policy
    assert default["wrapping"] == {"fully_shard_modules": 3, "param_dtype": "float32", "reduce_dtype": "float32"}
    assert default["config"]["train"]["fsdp_mixed_precision"] is False

    policy = ("--set", "train.fsdp_mixed_precision=true")
    mixed, mixed_losses = _fsdp_run(shards, params_file, tmp_path / "mixed", "bf16", *policy)
    assert mixed["status"] == "completed" and mixed["config"]["train"]["fsdp_mixed_precision"] is True
    assert mixed["wrapping"] == {"fully_shard_modules": 3, "param_dtype": "bfloat16", "reduce_dtype": "float32"}
    assert mixed_losses[-1] < 0.9 * mixed_losses[0]
    # bf16 parameter copies round more than autocast does, so the policy gets its own measured tolerance: two
    # ranks with it follow one process with it within MARGIN times what the policy does to single in bf16
    _fsdp_run(shards, params_file, tmp_path / "mixed_one", "bf16", *policy, nproc=1)
    assert_follows_in_precision(single_in("bf16"), tmp_path / "mixed_one", tmp_path / "mixed")


@pytest.mark.gpu
@pytest.mark.timeout(600)
def test_mixed_precision_policy_on_gpu(shards, params_file, tmp_path):
    record, losses = _fsdp_run(shards, params_file, tmp_path, "bf16", "--set", "train.fsdp_mixed_precision=true",
                               nproc=1)
    assert record["wrapping"]["param_dtype"] == "bfloat16" and losses[-1] < losses[0]
