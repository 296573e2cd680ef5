"""A run of a study whose process crashes (a rank killed from outside, as a node failure would) is trained again in
the same Snakemake call (the train rule's `retries`); one that fails again does not stop the study: collect, plot
and report still run and name it with its error line, and running the same command again trains that run alone
before collecting again. A study on a GPU node runs for a day; one lost rank must not cost the other runs their
summary, nor the user another call."""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time

import psutil
import pytest

from gpt2dist.pipeline.layout import RUNS_DIR

from reduced_study import run

pytestmark = pytest.mark.slow
VICTIM = "ddp-fp32-n2-r1"


def kill_a_rank_of_each_launch(run_dir, launches: int, killed: list[str], timeout_s: float = 300) -> None:
    """SIGKILL one rank of each of the next `launches` launches of the run in `run_dir`, once its rank 0 has said it
    trains (a thread beside the tool); `killed` gets each launch's attempt id."""
    spec, deadline = str(run_dir / "spec.json"), time.monotonic() + timeout_s
    while len(killed) < launches and time.monotonic() < deadline:
        launch = training_launch(run_dir)
        if launch is not None and launch not in killed:
            # its worker processes: those whose launcher (torchrun, which names the spec too) started them
            named = {p.pid: p for p in psutil.process_iter(["cmdline", "ppid"]) if spec in (p.info["cmdline"] or [])}
            ranks = [p for p in named.values() if p.info["ppid"] in named]
            if ranks:
                os.kill(ranks[-1].pid, signal.SIGKILL)
                killed.append(launch)
        time.sleep(0.01)


def training_launch(run_dir) -> str | None:
    """The attempt id of the run's launch once it has begun training (rank 0's report names the launch that
    spec.json does); None before."""
    try:
        launch = json.loads((run_dir / "spec.json").read_text())["attempt"]
        return launch if json.loads((run_dir / "rank0.json").read_text())["attempt"] == launch else None
    except (OSError, ValueError, KeyError):  # not written yet, or being replaced
        return None


def snakemake_killing(work, launches: int, *args: str):
    """`snakemake --cores 2 ARGS` in the study while a rank of each of the victim's next `launches` launches is
    killed; what it printed, and how many launches lost a rank."""
    killed: list[str] = []
    killer = threading.Thread(target=kill_a_rank_of_each_launch, args=(work / RUNS_DIR / VICTIM, launches, killed),
                              daemon=True)
    killer.start()
    done = run(["snakemake", "--cores", "2", *args], work)  # exits 0: collect, plot and report ran
    killer.join(timeout=60)
    return done.stdout + done.stderr, len(killed)


def trained_runs(output: str) -> list[str]:
    return re.findall(r"rule train:\n(?:.*\n)*?\s+wildcards: run=(\S+)", output)


@pytest.mark.timeout(1200)
def test_a_crashed_run_is_retried_in_the_same_call_and_one_that_fails_again_is_named_and_retried_alone(finished_copy):
    work = finished_copy  # the finished study, one run of it to train again
    run_dir = work / RUNS_DIR / VICTIM
    forced = ["--forcerun", f"{RUNS_DIR}/{VICTIM}/run.json"]

    # a rank killed once: the same call trains the run again, and the study ends complete
    output, kills = snakemake_killing(work, 1, *forced)
    assert kills == 1 and trained_runs(output) == [VICTIM, VICTIM], output[-3000:]
    assert json.loads((run_dir / "run.json").read_text())["status"] == "completed"
    summary = json.loads((work / "results" / "summary.json").read_text())
    assert summary["missing_runs"] == {} and summary["configs"]["ddp-fp32-n2"]["repeats"] == 2

    # control: killed in both launches, the run is recorded as failed, and the rest of the study goes on
    output, kills = snakemake_killing(work, 2, *forced)
    assert kills == 2 and trained_runs(output) == [VICTIM, VICTIM], output[-3000:]
    record = json.loads((run_dir / "run.json").read_text())
    assert record["status"] == "failed" and record["error"], record
    summary = json.loads((work / "results" / "summary.json").read_text())
    assert list(summary["missing_runs"]) == [VICTIM]
    assert f"did not complete (status 'failed': {record['error']})" in summary["missing_runs"][VICTIM]
    assert summary["configs"]["ddp-fp32-n2"]["repeats"] == 1  # summarised from the repeat that completed
    markdown = (work / "results" / "summary.md").read_text()
    assert f"- `{VICTIM}`: run {VICTIM} did not complete" in markdown.split("## Every configuration")[0]
    assert "snakemake --cores all" in markdown.split("## Every configuration")[0]  # how to retry it, up front
    assert "rule report:" in output

    # the same command again: that run alone trains, then collect, plot and report
    again = run(["snakemake", "--cores", "2"], work)
    assert trained_runs(again.stdout + again.stderr) == [VICTIM], again.stdout[-3000:]
    assert json.loads((run_dir / "run.json").read_text())["status"] == "completed"
    assert json.loads((work / "results" / "summary.json").read_text())["missing_runs"] == {}
    # and once it completed, nothing is left to retry
    assert "Nothing to be done" in (done := run(["snakemake", "--cores", "2"], work)).stdout + done.stderr
