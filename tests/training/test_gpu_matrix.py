"""What `pytest -m gpu` proves on a GPU node, with real NCCL: every strategy x precision at one GPU and at
all visible GPUs following single in the same precision (fp32 within GPU_RTOL, a reduced precision within
MARGIN times what it alone does to single), the fp32 equivalence of dp/ddp/fsdp/horovod/tp/pp/apex-ddp with
single at 2 GPUs, fsdp-tp's at 4 and the splits' at 4 and 8, with summed gradients shown to fail it, Horovod on NCCL, a
kill-and-resume for every strategy, and the MFU benchmark. Skipped without CUDA; combinations the study
itself refuses are skipped with its reason."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys

import pytest
import torch
from test_equivalence import (
    SummingDDP,
    assert_follows_in_precision,
    assert_follows_reference,
    assert_summed_gradients,
    train_with_fault,
)
from test_splits import SPLITS

from gpt2dist.config.presets import load_params
from gpt2dist.config.schema import PRECISIONS, STRATEGY_NAMES, ModelConfig, RunSpec, TrainConfig
from gpt2dist.config.strategies import check_run
from gpt2dist.errors import UsageError
from gpt2dist.launch.runner import build_spec
from gpt2dist.training.loop import Trainer
from gpt2dist.training.strategies import REGISTRY

from conftest import (REPO, STUDY_REFUSES, TINY_PRESET, gpt2dist, read_metrics, run_record, start_ranks,
                      train_args)

pytestmark = pytest.mark.gpu

GPUS = torch.cuda.device_count()
ONE_ROW = ("--set", "train.micro_batch_size=1")  # the global batch of 8 divides over 1, 2, 4 or 8 GPUs
# Extending a run with --max-steps is a resume, but the cosine decay is laid out over max_steps, so a
# 6-step run decays faster than the first 6 steps of a 12-step one. A flat tail (min_lr = lr) makes
# the schedule a function of the step alone, and the resumed run comparable with the whole one.
FLAT_SCHEDULE = ("--set", f"train.min_lr={TINY_PRESET['train']['lr']}")
# fp32 on GPUs is not bitwise: NCCL sums in another order than one GPU's reduction, and the embedding's
# backward adds with atomics. On CPU the same reordering (gloo) leaves two processes' losses about 1e-7
# apart; GPU_RTOL allows 1000 times that, and stays 1000 times below the faults it must catch (summed
# gradients double step 0's gradient norm: a relative gap of 1), which test_summed_gradients_fail_on_gpus
# shows on the GPUs at hand.
GPU_RTOL = 1e-4


def refused_by_the_rules(strategy: str, precision: str, nproc: int) -> bool:
    """The combinations the study refuses on GPUs for the tiny model, stated here apart from check_run, so that
    check_run refusing a valid one fails a test instead of skipping it (test_strategies checks the two agree)."""
    model = TINY_PRESET["model"]
    apex = precision.startswith("apex")
    return any([
        strategy == "single" and nproc > 1,  # one process
        strategy == "dp" and precision == "apex-O2",  # O2 patches a forward that DataParallel's replicas share
        apex and strategy in ("fsdp", "tp", "pp", "fsdp-tp", "zero1", "zero2", "hsdp"),  # sharded or split state
        strategy == "hsdp" and nproc % 2,  # its shard groups are of 2 ranks
        precision == "fp16" and strategy in ("tp", "pp", "fsdp-tp") and nproc > 1,  # the loss scaler cannot wrap them
        strategy == "apex-ddp" and precision in ("fp16", "bf16"),  # Apex's DDP pairs with Apex amp or fp32
        strategy == "fsdp-tp" and nproc % 2,  # its tensor-parallel size is 2
        strategy == "tp" and model["n_head"] % nproc,  # heads split over the ranks
        strategy == "pp" and model["n_layer"] < nproc,  # a block per stage at least
    ])


def refusal(strategy: str, precision: str, nproc: int, gpus: int = GPUS) -> str | None:
    """Why the study refuses this combination on a node of `gpus` GPUs, or None; a refusal the rules above do not
    make, or a combination they refuse that check_run lets through, fails."""
    spec = RunSpec(data_dir="", out_dir="", preset="tiny", strategy=strategy, precision=precision, nproc=nproc,
                   device="cuda", model=ModelConfig(**TINY_PRESET["model"]),
                   train=TrainConfig(**{**TINY_PRESET["train"], "micro_batch_size": 1}))
    try:
        check_run(spec, gpus)
    except UsageError as exc:
        if not refused_by_the_rules(strategy, precision, nproc):
            pytest.fail(f"check_run refuses {strategy} {precision} on {nproc} of {gpus} GPUs, which is valid: {exc}")
        return STUDY_REFUSES + str(exc)
    if refused_by_the_rules(strategy, precision, nproc):
        pytest.fail(f"check_run lets {strategy} {precision} on {nproc} of {gpus} GPUs through, which the study refuses")
    if (precision.startswith("apex") or strategy == "apex-ddp") and importlib.util.find_spec("apex") is None:
        return "needs NVIDIA Apex (the container image builds it)"
    return None


MATRIX = [(s, p, n) for s in STRATEGY_NAMES for p in PRECISIONS for n in sorted({1, max(GPUS, 1)})]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("strategy, precision, nproc", MATRIX, ids=[f"{s}-{p}-n{n}" for s, p, n in MATRIX])
def test_every_strategy_and_precision_follows_single(strategy, precision, nproc, single_in, shards, params_file,
                                                     tmp_path):
    reason = refusal(strategy, precision, nproc)
    if reason:
        pytest.skip(reason)
    gpt2dist(*train_args(shards, params_file, tmp_path, strategy, *ONE_ROW, nproc=nproc, precision=precision))
    record = run_record(tmp_path)
    assert record["status"] == "completed" and record["placement"]["device"].startswith("cuda")
    if strategy == "horovod":  # a CPU-only Horovod build would train too, on its gloo ops
        assert record["placement"]["backend"].endswith("+ nccl"), record["placement"]
    losses = [line["loss"] for line in read_metrics(tmp_path)]
    assert losses[-1] < 0.9 * losses[0], losses
    if strategy == "single":
        return
    if precision == "fp32":
        assert_follows_reference(single_in("fp32", *ONE_ROW), tmp_path, rtol=GPU_RTOL, atol_params=GPU_RTOL)
    else:
        assert_follows_in_precision(single_in("fp32", *ONE_ROW), single_in(precision, *ONE_ROW), tmp_path)


@pytest.fixture(scope="module")
def gpu_reference(single_in):
    return single_in("fp32", *ONE_ROW)


@pytest.mark.timeout(600)
@pytest.mark.skipif(GPUS < 2, reason="needs 2 CUDA GPUs")
@pytest.mark.parametrize("strategy", ["dp", "ddp", "fsdp", "horovod", "tp", "pp", "apex-ddp", "zero1", "zero2", "hsdp"])
def test_two_gpus_follow_single_in_fp32(strategy, gpu_reference, shards, params_file, tmp_path):
    """fp32 means IEEE fp32 (TF32 off), so NCCL ranks (dp: one process's replicas) follow one GPU."""
    reason = refusal(strategy, "fp32", 2)
    if reason:
        pytest.skip(reason)
    gpt2dist(*train_args(shards, params_file, tmp_path, strategy, *ONE_ROW, nproc=2))
    assert_follows_reference(gpu_reference, tmp_path, rtol=GPU_RTOL, atol_params=GPU_RTOL)


@pytest.mark.timeout(600)
@pytest.mark.skipif(GPUS < 2, reason="needs 2 CUDA GPUs")
def test_summed_gradients_fail_on_gpus(gpu_reference, shards, params_file, tmp_path):
    """GPU_RTOL's negative control: ddp that sums its ranks' gradients over NCCL falls outside it, by exactly the
    doubled step-0 gradient norm that summing makes."""
    train_with_fault("ddp", SummingDDP, shards, params_file, tmp_path, overrides=["train.micro_batch_size=1"])
    assert_summed_gradients(gpu_reference, tmp_path, rtol=GPU_RTOL, ratio_rtol=GPU_RTOL)


class OneDeviceTokensDP(REGISTRY["dp"]):
    """dp whose loss divides the devices' summed losses by one device's tokens: the gradients of its replicas
    summed, not averaged (the fault a hand-written gather makes)."""

    def loss_module(self, model, precision, loss):
        parallel = super().loss_module(model, precision, loss)
        devices = len(parallel.device_ids)

        class Undivided(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.parallel = parallel

            def forward(self, inputs, targets):
                sums, counts = self.parallel(inputs, targets)
                return sums, counts / devices

        return Undivided()


def _apex_ddp_summing() -> None:
    """In each rank: Apex's wrapper built with gradient_average=False, so it sums the ranks' gradients."""
    import functools
    import types

    from gpt2dist.training.strategies import apex_ddp

    real = apex_ddp.require_apex_parallel()
    summing = functools.partial(real.DistributedDataParallel, gradient_average=False)
    apex_ddp.require_apex_parallel = lambda: types.SimpleNamespace(DistributedDataParallel=summing)


def _train_in_one_process(_rank: int, strategy_class, spec_json: str) -> None:
    spec = RunSpec.model_validate_json(spec_json)
    strategy = strategy_class(spec)
    try:
        Trainer(spec, strategy).run()
    finally:
        strategy.teardown()


@pytest.mark.timeout(600)
@pytest.mark.skipif(GPUS < 2, reason="needs 2 CUDA GPUs")
def test_dp_with_its_devices_gradients_summed_fails_on_gpus(gpu_reference, shards, params_file, tmp_path):
    """dp's control, on the GPUs where its replicas are real (on CPU it is single's computation)."""
    spec = build_spec(data=shards, out=tmp_path, strategy="dp", precision="fp32", nproc=2, params=load_params(params_file),
                      preset=None, overrides=["train.micro_batch_size=1"])
    start_ranks(_train_in_one_process, OneDeviceTokensDP, spec.model_dump_json(), nprocs=1)
    assert_summed_gradients(gpu_reference, tmp_path, rtol=GPU_RTOL, ratio_rtol=GPU_RTOL)


@pytest.mark.timeout(600)
@pytest.mark.skipif(GPUS < 2, reason="needs 2 CUDA GPUs")
@pytest.mark.skipif(importlib.util.find_spec("apex") is None, reason="needs NVIDIA Apex (the container image)")
def test_apex_ddp_with_summed_gradients_fails_on_gpus(gpu_reference, shards, params_file, tmp_path):
    """apex-ddp's control: Apex's own switch for not averaging (gradient_average=False) falls outside GPU_RTOL."""
    train_with_fault("apex-ddp", REGISTRY["apex-ddp"], shards, params_file, tmp_path, inject=_apex_ddp_summing,
                     overrides=["train.micro_batch_size=1"])
    assert_summed_gradients(gpu_reference, tmp_path, rtol=GPU_RTOL, ratio_rtol=GPU_RTOL)


@pytest.mark.timeout(600)
@pytest.mark.skipif(GPUS < 4, reason="needs 4 CUDA GPUs")
def test_fsdp_tp_on_four_gpus_follows_single_in_fp32(gpu_reference, shards, params_file, tmp_path):
    gpt2dist(*train_args(shards, params_file, tmp_path, "fsdp-tp", *ONE_ROW, nproc=4))
    assert_follows_reference(gpu_reference, tmp_path, rtol=GPU_RTOL, atol_params=GPU_RTOL)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("strategy, nproc", SPLITS, ids=[s for s, _ in SPLITS])
def test_each_split_follows_single_in_fp32_over_nccl(strategy, nproc, gpu_reference, shards, params_file, tmp_path):
    """test_splits.py's splits on as many GPUs, NCCL's collectives on each group of the mesh."""
    if GPUS < nproc:
        pytest.skip(f"needs {nproc} CUDA GPUs")
    gpt2dist(*train_args(shards, params_file, tmp_path, strategy, *ONE_ROW, nproc=nproc))
    assert run_record(tmp_path)["placement"]["backend"] == "nccl"
    assert_follows_reference(gpu_reference, tmp_path, rtol=GPU_RTOL, atol_params=GPU_RTOL)


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
