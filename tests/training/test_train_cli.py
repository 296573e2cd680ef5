"""`gpt2dist train` end to end on CPU: precisions, kill-and-resume, bad input, printed commands."""

from __future__ import annotations

import shlex
import shutil
import subprocess

import pytest
import torch
from test_equivalence import assert_follows_in_precision

from gpt2dist.config.presets import load_params
from gpt2dist.launch.runner import build_spec
from gpt2dist.training.batches import BatchSampler
from gpt2dist.training.loop import Trainer
from gpt2dist.training.loop import run as train

from conftest import (RESUME_EXTRA, RESUME_STEPS, assert_resumed_exactly, gpt2dist, kill_after_checkpoint,
                      kill_forked_ranks_after_checkpoint, kill_point, rank_report, read_metrics, run_record, train_args,
                      train_in_forked_ranks)

pytestmark = pytest.mark.slow


def test_run_outputs(reference):
    record = run_record(reference)
    assert record["status"] == "completed" and record["strategy"] == "single" and record["nproc"] == 1
    assert record["config"]["model"]["n_layer"] == 2 and record["versions"]["torch"] == torch.__version__
    assert record["devices"]["cpu_cores"] >= 1 and "finished_at" in record
    assert record["compiled"] is False and record["compile_skipped"] is None  # not requested, so nothing skipped
    train, evals = read_metrics(reference), read_metrics(reference, "eval")
    assert [line["step"] for line in train] == list(range(12)) and [e["step"] for e in evals] == [6, 12]
    keys = {"loss", "lr", "step_time_s", "data_time_s", "tokens_per_s", "samples_per_s", "peak_mem_bytes"}
    assert keys <= train[0].keys() and train[0]["peak_mem_bytes"] > 0
    assert train[0]["tokens_per_s"] == pytest.approx(8 * 32 / train[0]["step_time_s"])
    assert evals[-1]["val_ppl"] == pytest.approx(2.718281828 ** evals[-1]["val_loss"], rel=1e-6)


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_single_in_a_reduced_precision_applies_it_and_learns(precision, single_in):
    low, full = read_metrics(single_in(precision)), read_metrics(single_in("fp32"))
    assert max(abs(a["loss"] - b["loss"]) for a, b in zip(low, full, strict=True)) > 1e-6  # really applied
    assert low[-1]["loss"] < 0.9 * low[0]["loss"]
    assert run_record(single_in(precision))["precision"] == precision


@pytest.mark.parametrize("strategy, precision", [("ddp", "bf16"), ("fsdp", "fp16")])
def test_two_ranks_in_a_reduced_precision_follow_single_in_it(strategy, precision, single_in, trained):
    run = trained(strategy, nproc=2, precision=precision)
    assert_follows_in_precision(single_in("fp32"), single_in(precision), run)
    assert run_record(run)["precision"] == precision


def test_compile_where_it_cannot_apply_is_recorded_with_the_reason(shards, params_file, tmp_path):
    gpt2dist(*train_args(shards, params_file, tmp_path, "dp", "--max-steps", "1", "--set", "train.compile=true"))
    record = run_record(tmp_path)
    assert record["compiled"] is False and record["compile_skipped"].startswith("DataParallel copies the module")


# Launched and killed: single (the command's own process) and fsdp (torchrun, its ranks' sharded checkpoint); ddp's
# and horovod's launchers are killed in test_signals.py (the same comparison). Each is held against the session's
# run, whose torchrun ranks are forked: a launched run and a forked one compute the same to the bit.
@pytest.mark.timeout(420)
@pytest.mark.parametrize("strategy, nproc", [("single", 1), ("fsdp", 2)], ids=["single-1-fp32", "fsdp-2-fp32"])
def test_sigkill_then_rerun_resumes_to_the_same_state(strategy, nproc, trained, shards, params_file, tmp_path):
    """Bitwise: data order and dropout are seeded per step, so a resumed run repeats the uninterrupted one (the
    session's run of the same configuration, which checkpoints less often: saving must not change the state)."""
    whole, killed = trained(strategy, nproc=nproc), tmp_path / "killed"
    kill_after_checkpoint(train_args(shards, params_file, killed, strategy, *RESUME_EXTRA, nproc=nproc), killed,
                          kill_point(f"{strategy}-{nproc}-fp32"))
    gpt2dist(*train_args(shards, params_file, killed, strategy, *RESUME_EXTRA, nproc=nproc))
    record = run_record(killed)
    assert record["status"] == "completed" and 0 < record["resumed_from_step"] < RESUME_STEPS
    # what the launcher adds: how busy the machine was meanwhile, and the command that started the run
    assert record["conditions"]["foreign_cpu_share"] and record["command_line"].endswith(shlex.join(RESUME_EXTRA))
    assert_resumed_exactly(killed, whole)


# Every other strategy (one in bf16: pp's, whose whole run test_pipeline_parallel.py shares) and the splits of
# test_splits.py (DP x TP, DP x PP, FSDP x PP, TP x PP and all three)
KILLED_RANKS = [("dp", 1, "fp32"), ("tp", 2, "fp32"), ("pp", 2, "bf16"), ("fsdp-tp", 4, "fp32"),
                ("hsdp", 4, "fp32"), ("zero1", 2, "fp32"), ("zero2", 2, "fp32"), ("ddp-tp2", 4, "fp32"),
                ("ddp-pp2", 4, "fp32"), ("fsdp-pp2", 4, "fp32"), ("tp2-pp2", 4, "fp32"), ("ddp-tp2-pp2", 8, "fp32")]


@pytest.mark.timeout(420)
@pytest.mark.parametrize("strategy, nproc, precision", KILLED_RANKS, ids=[f"{s}-{n}-{p}" for s, n, p in KILLED_RANKS])
def test_ranks_killed_then_rerun_resume_to_the_same_state(strategy, nproc, precision, trained, shards, params_file,
                                                           tmp_path):
    """Bitwise, as the launched runs above: the ranks killed at once after a checkpoint (a node's failure), then
    started again on the same spec, end where the uninterrupted run ends: each rank restores its shard, stage and
    tensor-parallel slice from single's layout. The ranks are forked, as the session's runs are: the launcher's
    part of a kill is the same for every strategy it starts (torchrun's: fsdp's above and test_signals.py's; the
    command's own process: single's above, as dp's), and a launch costs two to three times what its ranks compute
    here."""
    args = dict(nproc=nproc, precision=precision)
    whole, killed = trained(strategy, **args), tmp_path / "killed"
    kill_forked_ranks_after_checkpoint(shards, params_file, killed, strategy, *RESUME_EXTRA, **args,
                                       step=kill_point(f"{strategy}-{nproc}-{precision}"))
    train_in_forked_ranks(shards, params_file, killed, strategy, *RESUME_EXTRA, **args)
    record = run_record(killed)
    assert record["status"] == "completed" and 0 < record["resumed_from_step"] < RESUME_STEPS
    assert_resumed_exactly(killed, whole)


def _optimizer_state_dropped(monkeypatch):
    resume = Trainer.resume

    def forgetful(self):
        started = resume(self)
        self.optimizer.state.clear()  # AdamW's moments start again from zero
        return started

    monkeypatch.setattr(Trainer, "resume", forgetful)


def _step_off_by_one(monkeypatch):
    resume = Trainer.resume
    monkeypatch.setattr(Trainer, "resume", lambda self: (lambda step, lines: (step - 1, lines[:-1]))(*resume(self)))


def _data_order_restarted(monkeypatch):
    micro_batches = BatchSampler.micro_batches
    monkeypatch.setattr(BatchSampler, "micro_batches",
                        lambda self, step, rank, world, rows: micro_batches(self, step % 2, rank, world, rows))


BROKEN_RESTORES = {"none": lambda monkeypatch: None, "optimizer-state-dropped": _optimizer_state_dropped, "step-off-by-one": _step_off_by_one,
                   "data-order-restarted": _data_order_restarted}


@pytest.fixture(scope="module")
def killed_single(shards, params_file, tmp_path_factory):
    """single killed once its checkpoint of step 4 exists: every control resumes a copy of this one run."""
    killed = tmp_path_factory.mktemp("killed-single") / "run"
    kill_after_checkpoint(train_args(shards, params_file, killed, "single", *RESUME_EXTRA), killed, 4)
    return killed


@pytest.mark.timeout(300)
@pytest.mark.parametrize("broken", BROKEN_RESTORES)
def test_the_bitwise_check_catches_a_broken_restore(broken, trained, killed_single, shards, params_file, tmp_path,
                                                    monkeypatch):
    """The control for the resume test: the same kill, then a resume with one classic fault planted (in this
    process, so the fault lives in the code that resumes), must leave the uninterrupted run."""
    whole, killed = trained("single", *RESUME_EXTRA), tmp_path / "killed"
    shutil.copytree(killed_single, killed)
    BROKEN_RESTORES[broken](monkeypatch)
    spec = build_spec(data=shards, out=killed, strategy="single", precision="fp32", nproc=1, params=load_params(params_file),
                      preset=None, overrides=["train.max_steps=12", "train.checkpoint_interval=2"])
    train(spec)
    if broken == "none":  # the same resume without a fault is exact: what fails below is the fault
        assert_resumed_exactly(killed, whole)
        return
    with pytest.raises(AssertionError):
        assert_resumed_exactly(killed, whole)


@pytest.mark.timeout(300)
def test_a_checkpoint_of_other_settings_is_refused_or_replaced(shards, params_file, tmp_path):
    """The workflow tools re-run a job whose settings changed (--stale-checkpoint restart); every rank
    reads the old checkpoint, so none may delete it under the others."""
    out, extra = tmp_path / "run", ["--max-steps", "4", "--set", "train.checkpoint_interval=4"]
    gpt2dist(*train_args(shards, params_file, out, "ddp", *extra, nproc=2))
    before = read_metrics(out)
    other = [*extra, "--set", "train.lr=0.001"]
    refused = gpt2dist(*train_args(shards, params_file, out, "ddp", *other, nproc=2), check=False)
    assert refused.returncode != 0 and "belongs to a run with other settings" in refused.stderr, refused.stderr
    gpt2dist(*train_args(shards, params_file, out, "ddp", *other, "--stale-checkpoint", "restart", nproc=2))
    record, after = run_record(out), read_metrics(out)
    assert record["status"] == "completed" and not record.get("resumed_from_step"), record
    assert [line["step"] for line in after] == [0, 1, 2, 3] and after[-1]["loss"] != before[-1]["loss"]


def _flip_byte(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    "case, expected",
    [
        ("unknown-strategy", "unknown --strategy 'ring'"),
        ("batch-not-divisible", "train.global_batch_size (8) must be divisible by nproc x train.micro_batch_size"),
        ("missing-shard", "train.bin is missing"),
        ("flipped-byte", "train.bin is corrupt"),
        ("apex-without-apex", "NVIDIA Apex (apex.amp) is not importable here"),
        ("unknown-key", "unknown key 'train.lrate'"),
        ("vocab-too-large", "the data's vocabulary (500) exceeds model.vocab_size (100)"),
    ],
)
def test_bad_input_fails_with_one_line(case, expected, shards, params_file, tmp_path):
    data, strategy, nproc, precision, extra = tmp_path / "data", "single", 1, "fp32", []
    shutil.copytree(shards, data)
    if case == "unknown-strategy":
        strategy = "ring"
    elif case == "batch-not-divisible":
        strategy, nproc = "ddp", 3
    elif case == "missing-shard":
        (data / "train.bin").unlink()
    elif case == "flipped-byte":
        _flip_byte(data / "train.bin")
    elif case == "apex-without-apex":
        strategy, nproc, precision = "ddp", 2, "apex-O1"
    elif case == "unknown-key":
        extra = ["--set", "train.lrate=0.1"]
    elif case == "vocab-too-large":
        extra = ["--set", "model.vocab_size=100"]
    out = tmp_path / "run"
    result = gpt2dist(*train_args(data, params_file, out, strategy, *extra, nproc=nproc, precision=precision),
                      check=False)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0], result.stderr
    assert not (out / "run.json").exists()


def test_print_command_and_multinode(shards, params_file, tmp_path):
    local = gpt2dist(*train_args(shards, params_file, tmp_path, "ddp", "--print-command", nproc=2))
    assert "gpt2dist.launch.forking_torchrun --standalone --nproc-per-node=2 --start-method=fork" in local.stdout
    # the hosts' 16 processes must divide the global batch, as a run here must (checked like any other run)
    multi = gpt2dist(*train_args(shards, params_file, tmp_path, "horovod", "--hosts", "cpu-a:8,cpu-b:8",
                                  "--gpus", "0", "--set", "train.global_batch_size=32", nproc=16))
    assert "horovodrun -np 16 -H cpu-a:8,cpu-b:8 --gloo" in multi.stdout and "mpirun -np 16" in multi.stdout
    assert '"nproc": 16' in (tmp_path / "spec.json").read_text()
    assert not (tmp_path / "run.json").exists()


def test_a_full_disk_is_one_line_and_the_same_command_resumes_once_there_is_room(shards, params_file, reference,
                                                                                small_disk):
    """A full disk under --out ended in torch's 'unexpected pos' traceback. On a disk with room for one checkpoint
    and half of the next, the run stops at its second checkpoint with one error line naming the disk; the first
    stays intact, and once the disk has room the same command resumes from it to the uninterrupted run's end,
    bitwise (the control that the disk did fill where planned: the first checkpoint was written)."""
    size = (reference / "checkpoint.pt").stat().st_size
    out = small_disk(size + size // 2 + (64 << 10))  # 64 KiB for the spec, the records and the metrics
    args = train_args(shards, params_file, out, "single")
    failed = gpt2dist(*args, check=False)
    errors = [line for line in failed.stderr.splitlines() if line.startswith("error:")]
    assert failed.returncode == 2 and "Traceback" not in failed.stderr, failed.stderr[-3000:]
    assert len(errors) == 1 and errors[0].startswith(f"error: no space left on the disk holding {out} ("), errors
    assert "while writing checkpoint.pt; free space there or write elsewhere" in errors[0]
    assert run_record(out)["status"] == "failed" and "no space left" in run_record(out)["error"]
    assert rank_report(out)["checkpoint_step"] == 6 and [p.name for p in out.glob(".*.tmp")] == []
    subprocess.run(["mount", "-o", f"remount,size={4 * size}", str(out)], check=True)
    resumed = gpt2dist(*args)
    assert f"resumed from {out / 'checkpoint.pt'} at step 6" in resumed.stderr
    assert_resumed_exactly(out, reference)
