"""Stopping `gpt2dist train`: a signal sent to the launcher alone (never to its process group) reaches
every rank, a killed launcher leaves no rank behind, a run directory has one launcher at a time, and
a machine one run at a time."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from gpt2dist.launch.lifetime import ended
from gpt2dist.launch.locks import RANKS_LOCK

from conftest import (RESUME_EXTRA, RESUME_STEPS, assert_resumed_exactly, gpt2dist, has_checkpoint, has_metrics,
                      Launch, rank_report, read_metrics, run_record, train_args)

pytestmark = pytest.mark.slow

LONG = ["--max-steps", "100000", "--set", "train.checkpoint_interval=2"]
NO_SURVIVORS_S = 10


# Every launcher (torchrun for ddp and fsdp, horovodrun) with SIGTERM and SIGKILL; SIGINT once, as
# it takes SIGTERM's path (lifetime.STOP_SIGNALS); fsdp, which shares ddp's launcher, with SIGTERM
# only (its ranks' own stop path: a sharded checkpoint in flight).
CASES = [pytest.param(strategy, sig, id=f"{strategy}-{sig.name}")
         for strategy in ("ddp", "horovod") for sig in (signal.SIGTERM, signal.SIGKILL)]
CASES += [pytest.param("ddp", signal.SIGINT, id="ddp-SIGINT"), pytest.param("fsdp", signal.SIGTERM, id="fsdp-SIGTERM")]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("strategy, sig", CASES)
def test_a_signal_to_the_launcher_stops_every_rank(strategy, sig, shards, params_file, tmp_path, launches, trained):
    """SIGKILL leaves the record to the next launch: the same command resumes, bitwise as the session's
    uninterrupted run (ddp's and horovod's kill-and-resume: every other strategy's is in test_train_cli.py)."""
    out = tmp_path / "run"
    steps = RESUME_EXTRA if sig == signal.SIGKILL else LONG
    launch = Launch(train_args(shards, params_file, out, strategy, *steps, nproc=2), out, tmp_path / "stderr.txt")
    launches.append(launch)
    # the first checkpoint of a 12-step run leaves it ten steps to be killed in
    launch.wait_for(has_checkpoint(out) if sig == signal.SIGKILL else has_metrics(out))
    assert len(launch.family) >= 4, "expected the launcher, its launcher child and two ranks"

    os.kill(launch.proc.pid, sig)
    assert launch.proc.wait(timeout=120) == (-sig if sig == signal.SIGKILL else 128 + sig)
    survivors = launch.survivors(within_s=NO_SURVIVORS_S)
    assert not survivors, f"still running {NO_SURVIVORS_S} s after {sig.name}: {survivors}"

    record = run_record(out)
    if sig == signal.SIGKILL:  # the record's writer died; the same command resumes from the last checkpoint
        assert record["status"] == "running"
        saved = rank_report(out)["checkpoint_step"]
        gpt2dist(*train_args(shards, params_file, out, strategy, *RESUME_EXTRA, nproc=2))
        record = run_record(out)
        assert record["status"] == "completed" and 0 < record["resumed_from_step"] == saved < RESUME_STEPS
        assert_resumed_exactly(out, trained(strategy, nproc=2))
        return
    stderr = launch.log.read_text()
    assert "Traceback" not in stderr, stderr
    last = stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: interrupted by {sig.name} at step "), stderr
    assert last.endswith(f"re-run the same command to resume from step {record['checkpoint_step']}")
    assert record["status"] == "interrupted" and record["signal"] == sig.name
    assert record["interrupted_at_step"] >= 1 and "finished_at" in record


@pytest.mark.timeout(300)
def test_a_stop_that_reaches_rank_zero_after_its_collective_failed_still_says_where(shards, params_file, tmp_path,
                                                                                     launches):
    """torchrun passes a stop on to its ranks one after the other; when rank 0's comes only after rank 1 has
    stopped and gone (CI saw it once, under load), rank 0's collective fails first and its stop comes after.
    Made certain here: torchrun is held (SIGSTOP) while rank 1 alone is stopped and rank 0's collective fails,
    then the launcher gets SIGINT and torchrun goes on. The record and the last line still say where the run
    ended and where it resumes."""
    out = tmp_path / "run"
    launch = Launch(train_args(shards, params_file, out, "ddp", *LONG, nproc=2), out, tmp_path / "stderr.txt")
    launches.append(launch)
    launch.wait_for(has_checkpoint(out))
    [torchrun] = psutil.Process(launch.proc.pid).children()
    metrics = str(out / "metrics.jsonl")  # rank 0 alone holds it open
    [rank0], [rank1] = ([p for p in torchrun.children() if writes(p, metrics) == is_rank0] for is_rank0 in (1, 0))

    torchrun.suspend()
    rank1.send_signal(signal.SIGINT)
    wait_until(lambda: ended(rank0) and ended(rank1), "the ranks did not end")
    os.kill(launch.proc.pid, signal.SIGINT)
    wait_until(lambda: signal.SIGINT in pending_signals(torchrun.pid), "the launcher did not pass SIGINT on")
    torchrun.resume()

    assert launch.proc.wait(timeout=120) == 128 + signal.SIGINT
    record = run_record(out)
    last = launch.log.read_text().strip().splitlines()[-1]
    assert record["status"] == "interrupted" and record["interrupted_at_step"] >= record["checkpoint_step"] > 0
    assert last == (f"error: interrupted by SIGINT at step {record['interrupted_at_step']}; "
                    f"re-run the same command to resume from step {record['checkpoint_step']}")


@pytest.mark.timeout(300)
def test_a_rank_that_dies_fails_the_run_at_the_step_rank_zero_reached(shards, params_file, tmp_path, launches):
    out = tmp_path / "run"
    launch = Launch(train_args(shards, params_file, out, "ddp", *LONG, nproc=2), out, tmp_path / "stderr.txt")
    launches.append(launch)
    launch.wait_for(has_checkpoint(out))
    [torchrun] = psutil.Process(launch.proc.pid).children()
    [rank1] = [p for p in torchrun.children() if not writes(p, str(out / "metrics.jsonl"))]

    rank1.kill()
    assert launch.proc.wait(timeout=120) == 2
    record = run_record(out)
    assert record["status"] == "failed" and record["failed_at_step"] >= record["checkpoint_step"] > 0
    assert launch.log.read_text().strip().splitlines()[-1] == (
        f"error: training failed at step {record['failed_at_step']} (torchrun exited with 1); "
        "the ranks' messages are above")


def writes(process: psutil.Process, path: str) -> bool:
    return any(f.path == path for f in process.open_files())


def pending_signals(pid: int) -> set[int]:
    """The signals sent to a process and not yet handled (a stopped one handles none)."""
    status = dict(line.split(":\t", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    pending = int(status["ShdPnd"], 16) | int(status["SigPnd"], 16)
    return {n for n in range(1, 65) if pending >> (n - 1) & 1}


def wait_until(condition, failure: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, failure
        time.sleep(0.05)


@pytest.mark.timeout(300)
def test_a_second_launcher_on_the_same_directory_is_refused(shards, params_file, tmp_path, launches):
    out = tmp_path / "run"
    first = Launch(train_args(shards, params_file, out, "single", *LONG), out, tmp_path / "stderr.txt")
    launches.append(first)
    first.wait_for(has_metrics(out))

    second = gpt2dist(*train_args(shards, params_file, out, "single", *LONG), check=False)
    assert second.returncode == 2
    lines = second.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {out} is in use by another gpt2dist train "
                                                   f"(pid {first.proc.pid} on "), second.stderr
    assert first.proc.poll() is None and run_record(out)["status"] == "running"

    os.kill(first.proc.pid, signal.SIGTERM)  # in-process training stops the same way
    assert first.proc.wait(timeout=60) == 128 + signal.SIGTERM
    assert run_record(out)["status"] == "interrupted"
    assert first.log.read_text().strip().splitlines()[-1].startswith("error: interrupted by SIGTERM at step ")


@pytest.mark.timeout(300)
def test_a_second_run_on_the_machine_waits_until_the_first_ends(shards, params_file, tmp_path, launches):
    first_out, second_out = tmp_path / "first", tmp_path / "second"
    first = Launch(train_args(shards, params_file, first_out, "single", *LONG), first_out, tmp_path / "first.txt")
    launches.append(first)
    first.wait_for(has_metrics(first_out))
    second = Launch(train_args(shards, params_file, second_out, "ddp", "--max-steps", 2, nproc=2), second_out,
                    tmp_path / "second.txt")
    launches.append(second)
    second.wait_for(lambda: "waiting for the machine: another gpt2dist run holds" in second.log.read_text())
    time.sleep(3)
    assert not (second_out / "run.json").exists() and second.proc.poll() is None

    os.kill(first.proc.pid, signal.SIGTERM)
    assert first.proc.wait(timeout=60) == 128 + signal.SIGTERM
    assert second.proc.wait(timeout=240) == 0, second.log.read_text()[-3000:]
    assert run_record(second_out)["status"] == "completed"
    assert run_record(second_out)["started_at"] >= run_record(first_out)["finished_at"]


@pytest.mark.timeout(300)
def test_ranks_of_an_earlier_launcher_keep_a_new_one_out(shards, params_file, tmp_path):
    """A rank that outlives its launcher holds the ranks' lock shared; a real process does so here."""
    out = tmp_path / "run"
    out.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, sys, time; f = open(sys.argv[1], 'a'); "
                               "fcntl.flock(f, fcntl.LOCK_SH); print('held', flush=True); time.sleep(600)",
                               str(out / RANKS_LOCK)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        result = gpt2dist(*train_args(shards, params_file, out, "ddp", nproc=2), check=False)
    finally:
        holder.kill()
        holder.wait()
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: ranks of an earlier run still use {out}"), result.stderr
    assert not (out / "run.json").exists()


@pytest.mark.timeout(300)
def test_a_launcher_killed_at_the_record_hand_over_resumes_to_the_same_end(shards, params_file, tmp_path, launches,
                                                                          trained):
    """The moment between rank 0 reporting a completed run and its launcher writing run.json: the launcher is
    stopped (SIGSTOP) while training, the ranks finish, then it is killed. run.json still says running, the
    checkpoint the pipeline drops is still there (it goes only once run.json says completed), and the same
    command completes the record without training again: the numbers of the session's uninterrupted run."""
    steps = ["--no-keep-checkpoint"]  # the preset's 12 steps, as the session's run
    whole, out = trained("ddp", nproc=2), tmp_path / "run"
    launch = Launch(train_args(shards, params_file, out, "ddp", *steps, nproc=2), out, tmp_path / "stderr.txt")
    launches.append(launch)
    launch.wait_for(has_metrics(out))
    os.kill(launch.proc.pid, signal.SIGSTOP)
    deadline = time.monotonic() + 120
    others = [p for p in launch.family if p.pid != launch.proc.pid]  # torchrun and the ranks
    while not (rank_report(out)["status"] == "completed" and all(ended(p) for p in others)):
        assert time.monotonic() < deadline, f"the ranks did not finish: {launch.survivors(within_s=0)}"
        time.sleep(0.1)
    os.kill(launch.proc.pid, signal.SIGKILL)
    launch.proc.wait(timeout=60)
    assert run_record(out)["status"] == "running" and (out / "checkpoint.pt").exists()

    gpt2dist(*train_args(shards, params_file, out, "ddp", *steps, nproc=2))
    record = run_record(out)
    assert record["status"] == "completed" and record["resumed_from_step"] == 12
    numbers = [[(line["step"], line.get("loss"), line.get("val_loss")) for line in read_metrics(run)]
               for run in (out, whole)]
    assert numbers[0] == numbers[1]
    assert not (out / "checkpoint.pt").exists()
