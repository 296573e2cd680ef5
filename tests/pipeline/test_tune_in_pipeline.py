"""`gpt2dist tune` for real, on 2 processes of this machine: the planner's short list measured as a study of its own
under Snakemake (the repository's rules), in rounds that drop what the study's paired test places slower and repeat
what it has not decided, within a budget; its answer, its bundle and rebuild, and the calibration recommend reads.

Three candidates of the tests' tiny model: zero1 and fsdp, whose steps lie within about 10% of each other, and tp,
several times slower (its all-reduces per block dwarf so small a model's computation). Beside other tests, the
runs' noise decides what is placed after each round, so each claim about a round holds whatever it decided: what
a round runs is the top and the undecided exactly (all three without halving), never what was placed."""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import pandas as pd
import pytest

from conftest import REPO
from reduced_study import UNJUDGED, copy_workflow, run

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
STUDIES = [arg for name in ("cpu-study", "two-node-cpu", "two-node-splits-cpu")
           for arg in ("--study", str(REPO / "docs" / "reference" / name))]
AMONG = ["zero1", "fsdp", "tp"]
BUDGET_S = 300


def tune(work: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    return run(["gpt2dist", "tune", "--nproc", "2", *STUDIES, *args], work, check=check)


def tuned(tmp_path_factory, name: str, *args: str) -> tuple[Path, subprocess.CompletedProcess, float]:
    work = copy_workflow(tmp_path_factory.mktemp(name), **UNJUDGED)
    started = time.monotonic()
    done = tune(work, "--among", ",".join(AMONG), "--resolve", "0", "--rounds", "1", "--budget", f"{BUDGET_S}s", *args)
    return work, done, time.monotonic() - started


@pytest.fixture(scope="module")
def halved(tmp_path_factory):
    return tuned(tmp_path_factory, "halved")


@pytest.fixture(scope="module")
def every(tmp_path_factory):
    """The control: the same tune without halving."""
    return tuned(tmp_path_factory, "every", "--no-halving")


def results(work: Path) -> Path:
    return work / "results" / "tune" / "results"


def rounds_of(work: Path) -> list[dict]:
    return json.loads((results(work) / "summary.json").read_text())["added_rounds"]


def trained(work: Path) -> pd.DataFrame:
    return pd.read_csv(results(work) / "runs.csv")


def test_the_tune_ends_within_its_budget_with_measured_tiers_from_the_study_s_own_runs(halved):
    work, done, wall = halved
    assert wall <= BUDGET_S, (wall, done.stdout[-2000:])
    plan = json.loads((results(work) / "tune.json").read_text())
    assert plan["wall_s"] <= plan["budget_s"] == BUDGET_S and sorted(plan["candidates"]) == sorted(AMONG)
    summary = (work / "results" / "tune" / "summary.md").read_text()
    assert summary.startswith("# gpt2dist tune: 2 processes on one machine, preset cpu's model in fp32")
    assert "## The answer" in summary and re.search(r"\*\*2 processes on one machine\*\*: (fastest is|the top tier)",
                                                    summary)
    # each candidate's prediction beside its measurement, and where the ledger puts the gap
    table = summary.split("## Predicted beside measured")[1].split("## The rounds")[0]
    for name in AMONG:
        row = rf"^\| {name} +\| [\d,.]+ +\| [\d,.]+ \([\d,.]+ to [\d,.]+\) +\| [+-]\d+% "
        assert re.search(row, table, re.M), table
    assert "compute" in table and "no traced step" not in table
    # the runs are the study's: its rules trained them (a log each), each with its record
    runs = trained(work)
    assert len(runs) >= 3 * len(AMONG)
    for run_id in runs["run_id"]:
        assert (work / "results" / "tune" / "logs" / "train" / f"{run_id}.log").is_file()
        assert json.loads((results(work) / "runs" / run_id / "run.json").read_text())["status"] == "completed"


def test_the_estimate_is_said_before_the_first_run_and_the_time_left_after_each(halved):
    work, done, _ = halved
    out = " ".join(done.stdout.split(" "))
    first = " ".join(out.split()).index("Estimate: round 1 is 9 runs (3 candidates x 3 repeats, interleaved)")
    after = re.findall(r"^study: (\d+) of (\d+) runs done.*; about .* left", out, re.M)
    assert first < " ".join(out.split()).index("study: 1 of") and len(after) == len(trained(work)), out[-3000:]
    assert [int(done_) for done_, _ in after] == list(range(1, len(after) + 1))
    # the estimate is the tune's, candidate by candidate: Snakemake's start does not time single again
    assert "estimate: timing" not in out and (results(work) / "estimate.json").is_file()


def test_a_round_repeats_the_top_and_the_undecided_and_drops_what_is_placed(halved, every):
    """After the first round (3 repeats each, interleaved) the next one runs the top and every candidate still
    undecided, exactly, and nothing the paired test placed (slower beyond the noise, or tied); the control, without
    halving, runs every candidate again in that round. Which candidates are placed after one round is the runs' noise
    to decide (tp, several times slower, is placed on a quiet machine; results/test_added_repeats.py decides the same
    rule on fixed numbers): each claim here holds whatever it decided."""
    work, _, _ = halved
    runs = trained(work)
    first = runs[runs["repeat"] < 3]
    assert sorted(first.groupby("config_id")["repeat"].apply(sorted).tolist()) == [[0, 1, 2]] * 3
    (decided,) = rounds_of(work)
    (gaps,) = decided["gaps"].values()
    undecided = next(iter(decided["undecided"].values()), [])  # the top first, then those it repeats
    later = sorted(runs.loc[runs["repeat"] == 3, "config_id"])
    assert later == sorted(undecided), (later, decided)
    placed = [config for config, gap in gaps.items() if gap == "slower"]
    assert not set(placed) & set(later)
    summary = (work / "results" / "tune" / "summary.md").read_text()
    if placed:
        assert f"slower than the top beyond the noise, dropped: {', '.join(placed)}" in summary
    if not undecided:
        assert decided["stopped"] == "every configuration is placed or tied"
        assert "the rounds stopped after round 1: one tier is left" in summary
    control, _, _ = every
    (decided_too,) = rounds_of(control)
    again = trained(control)
    later_too = sorted(again.loc[again["repeat"] == 3, "config_id"])
    if decided_too["undecided"]:
        assert later_too == sorted(f"{name}-fp32-n2" for name in AMONG), decided_too
    else:
        assert later_too == [] and decided_too["stopped"] == "every configuration is placed or tied"


def test_the_tune_bundles_and_rebuilds_to_the_same_answer(halved, tmp_path):
    work, _, _ = halved
    directory = work / "results" / "tune"
    run(["gpt2dist", "bundle", "--out", str(tmp_path / "tune.tar.gz")], directory)
    run(["gpt2dist", "figures", "--from", str(tmp_path / "tune.tar.gz"), "--out", str(tmp_path / "rebuilt")], tmp_path)
    assert (tmp_path / "rebuilt" / "tune.md").read_text() == (directory / "summary.md").read_text()
    assert json.loads((tmp_path / "rebuilt" / "calibration.json").read_text()) == json.loads(
        (directory / "calibration.json").read_text())
    rebuilt = pd.read_csv(tmp_path / "rebuilt" / "runs.csv")
    assert sorted(rebuilt["run_id"]) == sorted(trained(work)["run_id"])  # the added round's runs too


def calibrated_table(text: str) -> pd.DataFrame:
    """recommend's table for a CPU tune: split, predicted, calibrated and measured ms."""
    rows = [line.strip("|").split("|") for line in text.splitlines() if line.startswith("| ") and "split" not in line]
    return pd.DataFrame([[cell.strip() for cell in row] for row in rows],
                        columns=["split", "predicted", "calibrated", "measured", "correction"]).set_index("split")


def test_recommend_for_the_tuned_machine_moves_each_measured_prediction_to_its_measurement(halved, tmp_path):
    """`recommend --calibration` on the tune's file predicts the machine it ran on (the CPU step model from single's
    step the tune timed) and says it is calibrated: each measured split's prediction moves to what the tune measured.
    The control: the same file with each measurement set to its prediction leaves every prediction where it was."""
    work, _, _ = halved
    calibration = work / "results" / "tune" / "calibration.json"
    text = run(["gpt2dist", "recommend", "--calibration", str(calibration)], work).stdout
    assert "Calibrated by the tune of" in " ".join(text.split())
    table = calibrated_table(text)
    measured = json.loads(calibration.read_text())["tune"]["splits"]
    for name, split in measured.items():
        row = table.loc[name]
        moved, was = float(row["calibrated"].replace(",", "")), float(row["predicted"].replace(",", ""))
        truth = split["measured_step_s"] * 1e3
        assert abs(moved - truth) <= 0.1 and abs(was - split["predicted_step_s"] * 1e3) <= 0.1, row
        assert abs(moved - truth) < abs(was - truth) or abs(was - truth) <= 0.1
    unmeasured = [name for name in table.index if name not in measured]
    assert unmeasured and all(table.loc[name, "correction"].endswith("typical") for name in unmeasured)
    said = json.loads(calibration.read_text())
    for split in said["tune"]["splits"].values():
        split["measured_step_s"] = split["predicted_step_s"]
    (tmp_path / "flat.json").write_text(json.dumps(said))
    flat = calibrated_table(run(["gpt2dist", "recommend", "--calibration", str(tmp_path / "flat.json")], work).stdout)
    assert (flat["calibrated"] == flat["predicted"]).all(), flat
