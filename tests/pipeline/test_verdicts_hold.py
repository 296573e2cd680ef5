"""The same study twice on one machine gives the same answer: the same tiers in every placement, and every claim
the same verdict, or the second study's findings mark the claim unstable beside the first's verdict. On the
smallest study that still separates something: tp at 2 processes is well below ddp on a tiny model, and the
claim about tp's memory and throughput is judged."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from reduced_study import UNJUDGED, copy_workflow, run

# Alone: the claim is a quiet machine's. Beside the suite's other tests (it shared the machine until CI's run for
# 7fd3925) one repeat of three slowed by the other worker's load was enough to widen tp's paired interval past 1 in
# one study and not the other: tiers that differ for the load, not for the study.
pytestmark = [pytest.mark.slow, pytest.mark.alone]

RUNS = [{"strategies": ["ddp", "tp"], "precisions": ["fp32"], "nproc": [2]}]
SUMMARY = "results/summary.json"


def tiers(results: Path) -> dict[str, list[tuple[str, int | None]]]:
    answer = json.loads((results / "summary.json").read_text())["answer"]
    return {group["placement"]: [(row["config_id"], row["tier"]) for row in group["ranked"]] for group in answer}


def verdicts(results: Path) -> dict[str, str]:
    return {f["text"]: f["verdict"] for f in json.loads((results / "summary.json").read_text())["findings"]}


@pytest.mark.timeout(1800)
def test_a_study_run_twice_gives_the_same_tiers_and_verdicts_or_says_which_are_unstable(tmp_path):
    (tmp_path / "first").mkdir()
    # Which runs count is the disturbance tests' subject (test_disturbed_study.py, results/test_collect.py), not
    # this one's, which needs 3 or more pairs, and has 3: with 2, tp's 6.7x slower throughput is "not
    # distinguishable" (a t interval of one degree of freedom). ddp's steps take about 7 ms on this tiny model, where the scheduler
    # alone spreads them 25-33% around their median, rank 0 gets 50-60% of its threads' CPU time and repeats lie
    # up to 1.6x apart: with the preset's limits, 2 or 3 of 4 ddp runs were left out on a quiet machine here.
    # The scheduler's own spread leaves none out either (UNJUDGED): the test measures agreement, not disturbance.
    work = copy_workflow(tmp_path / "first", repeats=3, runs=RUNS, **UNJUDGED,
                         selftests=False)  # the runs are checks enough
    # up to collect: tiers and verdicts are in summary.json, and the figures and report are other tests' subject
    run(["snakemake", "--cores", "2", SUMMARY], work)
    # the second study trains every run again, on the first's tokenized data: a copy without the runs, where
    # Snakemake re-runs train and all that follows it
    shutil.copytree(work, tmp_path / "second", symlinks=True, ignore=lambda folder, names: (
        ["runs"] if Path(folder) == work / "results" else []))
    again = run(["snakemake", "--cores", "2", "--forcerun", "train", SUMMARY], tmp_path / "second")
    jobs = set(re.findall(r"^localrule (\w+):", again.stdout + again.stderr, re.M))
    assert "train" in jobs and not jobs & {"prepare", "selftest"}, jobs
    first, second = work / "results", tmp_path / "second" / "results"
    # something is separated, so agreement means something
    assert ("tp-fp32-n2", 2) in tiers(first)["2 processes on one machine"], tiers(first)
    assert tiers(first) == tiers(second)
    run(["gpt2dist", "report", "--results", str(second), "--against", str(first)], second.parent)
    findings = (second / "findings.md").read_text()
    assert "in the 1 other stored study of this preset" in findings
    for claim, verdict in verdicts(second).items():
        row = next(line for line in findings.splitlines() if claim in line)
        cells = [cell.strip() for cell in row.strip().strip("|").split("|")]
        assert verdict == verdicts(first)[claim] or cells[1] == f"{verdict}, but unstable", row
    assert {v for v in verdicts(first).values()} - {"not testable here"}  # some claim is judged, not all untestable
