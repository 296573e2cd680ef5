"""The same study twice on one machine gives the same answer: the same tiers in every placement, and every claim
the same verdict, or the second study's findings mark the claim unstable beside the first's verdict. On the
smallest study that still separates something: tp at 2 processes is well below ddp on a tiny model, and the
claim about tp's memory and throughput is judged."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reduced_study import copy_workflow, run

pytestmark = pytest.mark.slow

RUNS = [{"strategies": ["ddp", "tp"], "precisions": ["fp32"], "nproc": [2]}]


def tiers(results: Path) -> dict[str, list[tuple[str, int | None]]]:
    answer = json.loads((results / "summary.json").read_text())["answer"]
    return {group["placement"]: [(row["config_id"], row["tier"]) for row in group["ranked"]] for group in answer}


def verdicts(results: Path) -> dict[str, str]:
    return {f["text"]: f["verdict"] for f in json.loads((results / "summary.json").read_text())["findings"]}


@pytest.mark.timeout(1800)
def test_a_study_run_twice_gives_the_same_tiers_and_verdicts_or_says_which_are_unstable(tmp_path):
    studies = []
    for name in ("first", "second"):
        (tmp_path / name).mkdir()
        # 4 repeats: a disturbed run (marked, left out) still leaves 3 pairs; with 3 repeats, 2 pairs left tp's
        # 6.7x slower throughput "not distinguishable" once in CI here (a t interval of one degree of freedom).
        # ddp's steps take about 7 ms on this tiny model, where the scheduler alone spreads them 25-33% around
        # their median: with the preset's limit, 3 of 4 ddp runs were flagged on a quiet machine and left one
        # pair. The step-time limit is the disturbance tests' subject (test_disturbed_study.py), not this one's.
        work = copy_workflow(tmp_path / name, repeats=4, runs=RUNS, max_step_time_spread=1.0)
        run(["snakemake", "--cores", "2"], work)
        studies.append(work / "results")
    first, second = studies
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
