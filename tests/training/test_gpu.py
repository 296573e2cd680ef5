"""GPU-only paths (NCCL, DataParallel over devices, fp16 GradScaler, Apex). Skipped without CUDA."""

import csv
import gzip
import importlib.util
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

from gpt2dist.config.presets import load_params
from gpt2dist.launch.runner import build_spec
from gpt2dist.training.ledger import read_trace
from gpt2dist.training.loop import Trainer
from gpt2dist.training.model import TokenLoss, lm_loss
from gpt2dist.training.strategies import REGISTRY
from gpt2dist.training.strategies.single import Single

from conftest import gpt2dist, read_metrics, run_record, train_args

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("strategy, precision", [("single", "fp32"), ("ddp", "fp16"), ("ddp", "bf16"),
                                                 ("dp", "fp32"), ("fsdp", "bf16"), ("horovod", "fp16")])
def test_one_gpu(strategy, precision, shards, params_file, tmp_path):
    gpt2dist(*train_args(shards, params_file, tmp_path, strategy, precision=precision))
    record = run_record(tmp_path)
    assert record["status"] == "completed" and record["devices"]["gpus"]
    assert record["placement"]["device"].startswith("cuda")
    losses = [line["loss"] for line in read_metrics(tmp_path)]
    assert losses[-1] < losses[0]
    assert read_metrics(tmp_path)[-1]["peak_mem_bytes"] < torch.cuda.get_device_properties(0).total_memory


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
@pytest.mark.parametrize("strategy", ["dp", "ddp", "horovod"])
def test_two_gpus(strategy, shards, params_file, tmp_path):
    gpt2dist(*train_args(shards, params_file, tmp_path, strategy, nproc=2))
    assert run_record(tmp_path)["status"] == "completed"


@pytest.mark.timeout(120)
def test_task_bound_to_one_gpu_claims_cuda_0():
    """A SLURM task with --gpus-per-task=1 and local rank 3 sees its GPU as cuda:0 (DDP's device_ids follow it)."""
    probe = ("import torch; from gpt2dist.training.strategies.base import claim_gpu; "
             "print(claim_gpu(3), torch.cuda.current_device())")
    listed = os.environ.get("CUDA_VISIBLE_DEVICES") or ",".join(map(str, range(torch.cuda.device_count())))
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": listed.split(",")[-1]}  # the last GPU this job may use
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["cuda:0", "0"]


def trainer(shards, params_file, out, strategy: str, precision: str, nproc: int = 1) -> Trainer:
    spec = build_spec(data=shards, out=out, strategy=strategy, precision=precision, nproc=nproc, params=load_params(params_file),
                      preset=None, overrides=[])
    return Trainer(spec, REGISTRY[strategy](spec))


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_dp_replica_threads_compute_in_the_run_dtype(precision, shards, params_file, tmp_path):
    """DataParallel's worker threads inherit autocast, not its dtype (pytorch#125186); TokenLoss re-enters it."""
    dp = trainer(shards, params_file, tmp_path, "dp", precision, nproc=2)
    seen, lock = [], threading.Lock()

    def record(module, args, output):
        with lock:
            seen.append((threading.get_ident(), output[0].device.index, output[0].dtype))

    dp.model.register_forward_hook(record)  # replicas share the original's hooks
    dp.train_step(0)
    expected = {"bf16": torch.bfloat16, "fp16": torch.float16}[precision]
    assert {device for _, device, _ in seen} == {0, 1}
    assert threading.get_ident() not in {thread for thread, _, _ in seen}
    assert {dtype for _, _, dtype in seen} == {expected}


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
def test_dp_gathers_scalars_and_weights_uneven_chunks(shards, params_file, tmp_path):
    dp = trainer(shards, params_file, tmp_path, "dp", "fp32", nproc=2)
    inputs, targets = (t[:3].cuda() for t in next(dp.train_batches.micro_batches(0, 0, 1, 4)))
    sums, counts = dp.loss(inputs, targets)  # 3 rows over 2 GPUs: chunks of 2 and 1
    assert sums.shape == (2,) and counts.tolist() == [2 * targets.size(1), targets.size(1)]
    one_device = lm_loss(TokenLoss(dp.model, dp.precision.autocast), inputs, targets)
    assert lm_loss(dp.loss, inputs, targets).item() == pytest.approx(one_device.item(), rel=1e-5)


def test_batches_are_pinned_on_cuda(shards, params_file, tmp_path):
    """Pinned host batches make the non_blocking copy asynchronous, so data_time_s times host work only."""
    single = trainer(shards, params_file, tmp_path, "single", "fp32")
    for sampler in (single.train_batches, single.val_batches):
        inputs, targets = next(sampler.micro_batches(0, 0, 1, 2))
        assert inputs.is_pinned() and targets.is_pinned()
    line = single.train_step(0)
    assert 0 < line["data_time_s"] <= line["step_time_s"]


needs_apex = pytest.mark.skipif(importlib.util.find_spec("apex") is None, reason="needs NVIDIA Apex (the container image)")


@needs_apex
@pytest.mark.timeout(600)
@pytest.mark.parametrize("strategy, precision", [("single", "apex-O2"), ("dp", "apex-O1"), ("ddp", "apex-O1"),
                                                 ("ddp", "apex-O2"), ("horovod", "apex-O1"), ("horovod", "apex-O2"),
                                                 ("apex-ddp", "apex-O1"), ("apex-ddp", "apex-O2")])
def test_apex_trains_skips_compile_and_resumes(strategy, precision, shards, params_file, tmp_path):
    """Horovod: amp must patch the DistributedOptimizer (else scale_loss finds no _amp_stash). Extending
    a finished run is a resume, through Apex's checkpoint path (optimizer + amp state, O2 master weights)."""
    args = train_args(shards, params_file, tmp_path, strategy, "--set", "train.compile=true",
                      "--set", "train.checkpoint_interval=3", precision=precision)
    gpt2dist(*args, "--max-steps", "6")
    gpt2dist(*args, "--max-steps", "9")
    record = run_record(tmp_path)
    assert record["status"] == "completed" and record["resumed_from_step"] == 6
    # a strategy's own conflict (DataParallel's, Apex DDP's) is named first; the others are refused by Apex amp
    assert record["compiled"] is False
    expected = {"dp": "DataParallel", "apex-ddp": "Apex's wrapper"}.get(strategy, "Apex amp casts")
    assert record["compile_skipped"].startswith(expected)
    losses = [line["loss"] for line in read_metrics(tmp_path)]
    assert [line["step"] for line in read_metrics(tmp_path)] == list(range(9)) and losses[-1] < losses[0]


@needs_apex
@pytest.mark.timeout(600)
@pytest.mark.parametrize("strategy", ["single", "apex-ddp"])
def test_apex_o2_resumed_after_a_kill_ends_where_an_uninterrupted_run_ends(strategy, shards, params_file, tmp_path):
    """Not just 'the loss went down': a run stopped at step 6 and resumed ends at step 9 with the uninterrupted
    run's losses (a flat learning rate, so the schedule depends on the step alone), within what fp16's
    arithmetic on a GPU leaves; a resume that lost the O2 masters or the loss scale would not."""
    flat = ("--set", "train.min_lr=3e-3", "--set", "train.lr=3e-3", "--set", "train.checkpoint_interval=3",
            "--max-steps", "9")
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    gpt2dist(*train_args(shards, params_file, whole, strategy, *flat, precision="apex-O2"))
    gpt2dist(*train_args(shards, params_file, resumed, strategy, *flat[:-1], "6", precision="apex-O2"))
    gpt2dist(*train_args(shards, params_file, resumed, strategy, *flat, precision="apex-O2"))
    assert run_record(resumed)["resumed_from_step"] == 6
    a, b = read_metrics(resumed), read_metrics(whole)
    assert [line["step"] for line in a] == [line["step"] for line in b] == list(range(9))
    assert [line["loss"] for line in a[6:]] == pytest.approx([line["loss"] for line in b[6:]], rel=1e-3)


@needs_apex
def test_apex_o2_checkpoint_restores_master_weights_and_optimizer_state(shards, params_file, tmp_path):
    """Bitwise: O2's fp32 masters and fp32 Adam moments come back as saved, not rounded through fp16.
    In one process, so amp.initialize runs twice: harmless for O2, which patches no torch functions."""
    spec = build_spec(data=shards, out=tmp_path, strategy="single", precision="apex-O2", nproc=1,
                      params=load_params(params_file), preset=None, overrides=["train.max_steps=4"])
    first = Trainer(spec, Single(spec))
    first.run()
    saved_amp = first.precision.amp.state_dict()
    resumed = Trainer(spec, Single(spec))
    assert resumed.resume()[0] == 4
    amp = resumed.precision.amp
    pairs = list(zip(amp.master_params(first.optimizer), amp.master_params(resumed.optimizer), strict=True))
    assert all(a.dtype == torch.float32 and torch.equal(a, b) for a, b in pairs)
    assert all(torch.equal(a, b) for a, b in zip(first.model.parameters(), resumed.model.parameters(), strict=True))
    before, after = first.optimizer.state_dict()["state"], resumed.optimizer.state_dict()["state"]
    assert before.keys() == after.keys()
    for index, moments in before.items():
        assert all(torch.equal(value, after[index][key]) for key, value in moments.items())
    assert amp.state_dict() == saved_amp


@pytest.mark.timeout(600)
def test_hta_splits_a_kept_trace_as_the_ledger_split_that_step(shards, params_file, tmp_path):
    """Holistic Trace Analysis reads each rank's kept trace (one step, no ProfilerStep mark, hence
    include_last_profiler_step) and its temporal breakdown's compute time is the ledger's device compute of that
    step: both the union of the computation kernels (the ledger's also holds memory copies and sets, a sliver).
    The control: the same traces with all but one of their computation kernels removed are told apart."""
    trace_analysis = pytest.importorskip("hta.trace_analysis", reason="pip install HolisticTraceAnalysis")
    nproc = min(2, torch.cuda.device_count())
    run = tmp_path / "run"
    gpt2dist(*train_args(shards, params_file, run, "ddp", nproc=nproc))
    record = run_record(run)
    kept = record["ledger"]["per_step"][-1]
    device_compute_s = kept["compute_s"] + kept["comm_hidden_s"]  # the ledger's compute less its overlap

    def hta_compute_s(trace_dir: Path) -> float:
        analysis = trace_analysis.TraceAnalysis(trace_files=dict(enumerate(record["trace"]["files"])),
                                                trace_dir=str(trace_dir), include_last_profiler_step=True)
        breakdown = analysis.get_temporal_breakdown(visualize=False).set_index("rank")
        assert sorted(breakdown.index) == list(range(nproc))
        return breakdown.loc[0, "compute_time(us)"] / 1e6

    assert hta_compute_s(run) == pytest.approx(device_compute_s, rel=0.15)
    stripped = tmp_path / "stripped"
    (stripped / "kept").mkdir(parents=True)  # where the run's record names them
    for name in record["trace"]["files"]:
        trace = read_trace(run / name)
        computation = [e for e in trace["traceEvents"]
                       if e.get("cat") == "kernel" and not e["name"].lower().startswith("nccl")]
        dropped = {id(e) for e in computation[1:]}  # the first stays: HTA's breakdown merges at least one
        events = [e for e in trace["traceEvents"] if id(e) not in dropped]
        with gzip.open(stripped / name, "wt") as handle:
            json.dump({**trace, "traceEvents": events}, handle)
    assert hta_compute_s(stripped) != pytest.approx(device_compute_s, rel=0.15)


@pytest.mark.timeout(600)
def test_estimate_on_a_gpu_calibrates_the_step_model_and_plan_applies_it(params_file, tmp_path):
    """On a GPU node `gpt2dist estimate` times single's step at two micro-batches in each precision of the study and
    writes the GPU step model's correction beside its estimate; plan --calibration prints it and corrects by it
    (the same path tests/forecast/test_plan.py runs on a CPU)."""
    out = tmp_path / "estimate.json"
    said = gpt2dist("estimate", "--params", params_file, "--gpus", "1", "--runs", tmp_path / "runs", "--out", out).stdout
    timed = json.loads(out.read_text())["gpu_calibration"]["fp32"]
    assert timed["scale"] > 0 and len(timed["measured_s"]) == 2, timed
    assert "single's step at " in said and "at the preset's own step" in " ".join(said.split()), said
    assert f"--calibration {out}" in " ".join(said.split()) and timed["preset_step_s"][0] > 0, timed
    gpu = torch.cuda.get_device_name(0)
    shown = " ".join(gpt2dist("plan", "--params", params_file, "--gpus", "1", "--gpu", gpu,
                              "--calibration", out).stdout.split())
    assert f"in fp32 its computation x {timed['scale']:.3g}" in shown


@pytest.mark.timeout(900)
def test_a_one_gpu_tune_measures_its_short_list_and_recommend_reads_its_calibration(tmp_path):
    """`gpt2dist tune --gpus 1` on the tests' tiny model: the GPU step model prices every split of one GPU, the tune's
    study trains its candidates on the GPU in rounds under Snakemake, and its answer and calibration follow; `recommend
    --calibration` then predicts this GPU's splits corrected by what was measured, each measured one at its
    measurement (the same path tests/pipeline/test_tune_in_pipeline.py runs on CPUs)."""
    from conftest import REPO
    from reduced_study import UNJUDGED, copy_workflow

    work = copy_workflow(tmp_path, **UNJUDGED)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}

    def command(*args: str) -> subprocess.CompletedProcess:
        done = subprocess.run(["gpt2dist", *args], cwd=work, env=env, capture_output=True, text=True, timeout=800)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        return done

    tuned = command("tune", "--gpus", "1", "--among", "ddp,fsdp", "--rounds", "1", "--budget", "12m")
    said = " ".join(tuned.stdout.split())
    assert "predicted by the GPU step model on the" in said and "Measuring 2 of the 2 splits" in said, said
    tune = work / "results" / "tune"
    records = [json.loads(path.read_text()) for path in (tune / "results" / "runs").glob("*/run.json")]
    assert len(records) >= 6
    assert all(record["devices"]["gpus"] and record["status"] == "completed" for record in records)
    calibration = json.loads((tune / "calibration.json").read_text())["tune"]
    assert calibration["cluster"]["device"] == "cuda" and set(calibration["splits"]) == {"ddp", "fsdp"}
    assert (tune / "summary.md").read_text().startswith("# gpt2dist tune: 1 node(s) of 1 ")
    shown = command("recommend", "--calibration", str(tune / "calibration.json"), "--study",
                    str(REPO / "docs" / "reference" / "cpu-study")).stdout
    assert "Calibrated by the tune of" in " ".join(shown.split())
    for name, split in calibration["splits"].items():  # each measured split's step at its measurement
        row = next(line for line in shown.splitlines() if line.startswith(f"| {name} "))
        assert f"x{split['factor']:.2f} measured" in row and f"{split['measured_step_s'] * 1e3:,.2f}" in row, row
    # the same measurements as rows of the published table, held to the GPU step model out of source
    measured = {row["strategy"]: row for row in csv.DictReader((tune / "measured.csv").open())}
    assert {name: float(row["step_s"]) for name, row in measured.items()} == pytest.approx(
        {name: split["measured_step_s"] for name, split in calibration["splits"].items()})
    held = command("validate-published", "--add", str(tune / "measured.csv")).stdout
    assert any(line.startswith("| tune-1x1-") and "| gpt2dist " in line for line in held.splitlines()), held
