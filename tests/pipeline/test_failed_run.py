"""One run of a study fails (a rank killed from outside, as a node failure would): the rest of the study goes on,
collect, plot and report still run and name the failed run with its error line, and running the same command
again trains that run alone before collecting again. A study on a GPU node runs for a day; one lost rank must not
cost the other runs their summary."""

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


def kill_a_rank_once_it_trains(run_dir, killed: list[int], timeout_s: float = 300) -> None:
    """SIGKILL one rank of the run in `run_dir` once rank 0 has said it trains (a thread beside the tool)."""
    spec, deadline = str(run_dir / "spec.json"), time.monotonic() + timeout_s
    ranks: list[psutil.Process] = []
    while time.monotonic() < deadline:
        if not ranks:  # the worker processes, once their launcher (torchrun, which names the spec too) started them
            named = {p.pid: p for p in psutil.process_iter(["cmdline", "ppid"]) if spec in (p.info["cmdline"] or [])}
            ranks = [p for p in named.values() if p.info["ppid"] in named]
        elif (run_dir / "rank0.json").exists():  # written as the run starts: it is training now
            os.kill(ranks[-1].pid, signal.SIGKILL)
            killed.append(ranks[-1].pid)
            return
        time.sleep(0.01)


@pytest.mark.timeout(900)
def test_a_failed_run_does_not_stop_the_study_and_the_next_one_retries_it_alone(finished_copy):
    work = finished_copy  # the finished study, one run of it to train again
    run_dir = work / RUNS_DIR / VICTIM
    killed: list[int] = []
    killer = threading.Thread(target=kill_a_rank_once_it_trains, args=(run_dir, killed), daemon=True)
    killer.start()
    # exits 0: collect, plot and report ran on what completed
    first = run(["snakemake", "--cores", "2", "--forcerun", f"{RUNS_DIR}/{VICTIM}/run.json"], work)
    killer.join(timeout=60)
    assert killed, "no rank of the run was found to kill"
    record = json.loads((run_dir / "run.json").read_text())
    assert record["status"] == "failed" and record["error"], record
    summary = json.loads((work / "results" / "summary.json").read_text())
    assert list(summary["missing_runs"]) == [VICTIM]
    assert f"did not complete (status 'failed': {record['error']})" in summary["missing_runs"][VICTIM]
    assert summary["configs"]["ddp-fp32-n2"]["repeats"] == 1  # summarised from the repeat that completed
    markdown = (work / "results" / "summary.md").read_text()
    assert f"- `{VICTIM}`: run {VICTIM} did not complete" in markdown.split("## Every configuration")[0]
    assert "snakemake --cores all" in markdown.split("## Every configuration")[0]  # how to retry it, up front
    assert "rule report:" in first.stdout + first.stderr

    # the same command again: that run alone trains, then collect, plot and report
    again = run(["snakemake", "--cores", "2"], work)
    trained = re.findall(r"rule train:\n(?:.*\n)*?\s+wildcards: run=(\S+)", again.stdout + again.stderr)
    assert trained == [VICTIM], again.stdout[-3000:]
    assert json.loads((run_dir / "run.json").read_text())["status"] == "completed"
    assert json.loads((work / "results" / "summary.json").read_text())["missing_runs"] == {}
    # and once it completed, nothing is left to retry
    assert "Nothing to be done" in (done := run(["snakemake", "--cores", "2"], work)).stdout + done.stderr
