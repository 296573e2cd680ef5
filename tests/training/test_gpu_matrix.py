"""What `pytest -m gpu` proves on a GPU node, with real NCCL: every strategy x precision at one GPU
and at all visible GPUs, the fp32 equivalence of ddp/fsdp/horovod/tp/pp/apex-ddp with single at 2
GPUs (TF32 off, the CPU tolerance), fsdp-tp's at 4, a kill-and-resume for every strategy, and the MFU benchmark.
Skipped without CUDA; combinations the study itself refuses are skipped with its reason."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys

import pytest
import torch
from test_equivalence import assert_follows_reference

from gpt2dist.config.schema import PRECISIONS, ModelConfig, RunSpec, TrainConfig
from gpt2dist.config.strategies import STRATEGY_NAMES, check_run
from gpt2dist.errors import UsageError

from conftest import REPO, TINY_PRESET, gpt2dist, gpu, read_metrics, run_record, train_args

pytestmark = [pytest.mark.gpu, gpu]

GPUS = torch.cuda.device_count()
ONE_ROW = ("--set", "train.micro_batch_size=1")  # the global batch of 8 divides over 1, 2, 4 or 8 GPUs
# Extending a run with --max-steps is a resume, but the cosine decay is laid out over max_steps, so a
# 6-step run decays faster than the first 6 steps of a 12-step one. A flat tail (min_lr = lr) makes
# the schedule a function of the step alone, and the resumed run comparable with the whole one.
FLAT_SCHEDULE = ("--set", f"train.min_lr={TINY_PRESET['train']['lr']}")


def refusal(strategy: str, precision: str, nproc: int) -> str | None:
    """Why the study would refuse this combination on this node, or None."""
    spec = RunSpec(data_dir="", out_dir="", preset="tiny", strategy=strategy, precision=precision, nproc=nproc,
                   device="cuda", model=ModelConfig(**TINY_PRESET["model"]),
                   train=TrainConfig(**{**TINY_PRESET["train"], "micro_batch_size": 1}))
    try:
        check_run(spec, GPUS)
    except UsageError as exc:
        return str(exc)
    if (precision.startswith("apex") or strategy == "apex-ddp") and importlib.util.find_spec("apex") is None:
        return "needs NVIDIA Apex (the container image builds it)"
    return None


MATRIX = [(s, p, n) for s in STRATEGY_NAMES for p in PRECISIONS for n in sorted({1, max(GPUS, 1)})]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("strategy, precision, nproc", MATRIX, ids=[f"{s}-{p}-n{n}" for s, p, n in MATRIX])
def test_every_strategy_and_precision_trains(strategy, precision, nproc, shards, params_file, tmp_path):
    reason = refusal(strategy, precision, nproc)
    if reason:
        pytest.skip(reason)
    gpt2dist(*train_args(shards, params_file, tmp_path, strategy, *ONE_ROW, nproc=nproc, precision=precision))
    record = run_record(tmp_path)
    assert record["status"] == "completed" and record["placement"]["device"].startswith("cuda")
    losses = [line["loss"] for line in read_metrics(tmp_path)]
    assert losses[-1] < losses[0], losses


@pytest.fixture(scope="module")
def gpu_reference(shards, params_file, tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu-single")
    gpt2dist(*train_args(shards, params_file, out, "single", *ONE_ROW))
    return out


@pytest.mark.timeout(600)
@pytest.mark.skipif(GPUS < 2, reason="needs 2 CUDA GPUs")
@pytest.mark.parametrize("strategy", ["ddp", "fsdp", "horovod", "tp", "pp", "apex-ddp"])
def test_two_gpus_follow_single_in_fp32(strategy, gpu_reference, shards, params_file, tmp_path):
    """fp32 means IEEE fp32 (TF32 off), so NCCL ranks must match one GPU as gloo ranks match one CPU."""
    reason = refusal(strategy, "fp32", 2)
    if reason:
        pytest.skip(reason)
    gpt2dist(*train_args(shards, params_file, tmp_path, strategy, *ONE_ROW, nproc=2))
    assert_follows_reference(gpu_reference, tmp_path)


@pytest.mark.timeout(600)
@pytest.mark.skipif(GPUS < 4, reason="needs 4 CUDA GPUs")
def test_fsdp_tp_on_four_gpus_follows_single_in_fp32(gpu_reference, shards, params_file, tmp_path):
    gpt2dist(*train_args(shards, params_file, tmp_path, "fsdp-tp", *ONE_ROW, nproc=4))
    assert_follows_reference(gpu_reference, tmp_path)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("strategy", STRATEGY_NAMES)
def test_every_strategy_resumes_on_gpu(strategy, gpu_reference, shards, params_file, tmp_path):
    nproc = {"single": 1, "fsdp-tp": 4}.get(strategy, min(GPUS, 2))
    reason = refusal(strategy, "fp32", nproc)
    if reason:
        pytest.skip(reason)
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    gpt2dist(*train_args(shards, params_file, whole, strategy, *ONE_ROW, *FLAT_SCHEDULE, nproc=nproc))
    gpt2dist(*train_args(shards, params_file, resumed, strategy, *ONE_ROW, *FLAT_SCHEDULE, "--max-steps", "6",
                         nproc=nproc))
    gpt2dist(*train_args(shards, params_file, resumed, strategy, *ONE_ROW, *FLAT_SCHEDULE, nproc=nproc))
    assert run_record(resumed)["resumed_from_step"] == 6
    a, b = read_metrics(resumed), read_metrics(whole)
    assert [line["step"] for line in a] == [line["step"] for line in b]
    # CUDA's embedding backward adds with atomics, so two GPU runs agree closely, not bitwise
    assert a[-1]["loss"] == pytest.approx(b[-1]["loss"], rel=1e-4)


@pytest.mark.timeout(900)
def test_mfu_benchmark_runs():
    """The engine and the bare loop both measured, each with an MFU that is a share of the peak, and their ratio."""
    out = subprocess.run([sys.executable, "bench/mfu.py", "--rounds", "2", "--steps", "3", "--warmup", "3", "--set",
                          "train.micro_batch_size=4"], cwd=REPO, capture_output=True, text=True, timeout=850)
    assert out.returncode == 0, out.stderr[-3000:]
    shares = [float(x) for x in re.findall(r"MFU (\d+\.\d)%", out.stdout)]
    assert len(shares) == 2 and all(0 < x < 100 for x in shares), out.stdout
    assert re.search(r"engine/bare loop = \d\.\d{3} \(95% interval", out.stdout), out.stdout
