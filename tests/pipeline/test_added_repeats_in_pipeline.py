"""Snakemake adds repeat rounds after the planned ones, each decided by a checkpoint job from the runs so far,
for the configurations still undecided and their placement's top, until the budget in params.yaml is spent; the
added runs join the tables and the summary says what was added and why it stopped."""

from __future__ import annotations

import json
import os
import shlex

import pandas as pd
import pytest

from gpt2dist.config.presets import load_params
from gpt2dist.pipeline.jobs import train_command
from gpt2dist.pipeline.study import plan_study

from reduced_study import copy_workflow, hog, run

# Beside other tests: their load can flag more runs as disturbed, which each assertion allows (ddp, with at most one
# undisturbed pair, stays undecided, and a flagged added run only spends the budget sooner); passed 3 times out of 3
# beside two busy loops on both cores
pytestmark = pytest.mark.slow

HOGGED = "ddp-fp32-n1-r1"


@pytest.mark.timeout(1200)
def test_snakemake_adds_rounds_for_the_undecided_until_the_budget_is_spent(tmp_path):
    # single and ddp at one process, with ddp's second planned run trained beside a hog on every CPU: that run is
    # flagged and left out, so at most one undisturbed pair is left and ddp cannot be placed, whatever the two
    # configurations' speeds (two quiet pairs of nearly the same computation could place it by chance)
    work = copy_workflow(tmp_path, runs=[{"strategies": ["single", "ddp"], "precisions": ["fp32"], "nproc": [1]}],
                         added_repeats={"rounds": 3, "max_runs": 4, "resolve": 0.0}, selftests=False)
    others = ["single-fp32-n1-r0", "ddp-fp32-n1-r0", "single-fp32-n1-r1"]
    run(["snakemake", "--cores", "2", *(f"results/runs/{run_id}/run.json" for run_id in others)], work)
    study = plan_study(load_params(work / "params.yaml"), "cpu", 0)
    hogs = [hog(240) for _ in range(len(os.sched_getaffinity(0)))]
    try:
        run(shlex.split(train_command(study, next(r for r in study.runs if r.run_id == HOGGED))), work)
    finally:
        for process in hogs:
            process.kill()
            process.wait()
    run(["snakemake", "--cores", "2"], work)
    plans = [json.loads((work / "results" / "rounds" / f"added-{k}.json").read_text()) for k in (1, 2, 3)
             if (work / "results" / "rounds" / f"added-{k}.json").exists()]
    first = plans[0]
    assert sorted(first["runs"]) == ["ddp-fp32-n1-r2", "single-fp32-n1-r2"], first
    added = [run_id for plan in plans for run_id in plan["runs"]]
    assert len(added) <= 4 and plans[-1]["runs"] == [] and plans[-1]["stopped"], plans  # stopped, and says why
    # the budget is named only when it ran out with a configuration still undecided; with nothing undecided the
    # rounds stop for that, the fourth added run included (it may place the last one)
    if plans[-1]["undecided"]:
        assert plans[-1]["stopped"].startswith("the budget is spent") and len(added) == 4, plans
    else:
        assert plans[-1]["stopped"] == "every configuration is placed or tied", plans
    table = pd.read_csv(work / "results" / "runs.csv").set_index("run_id")
    assert set(added) <= set(table.index) and {"ddp-fp32-n1-r0", HOGGED} <= set(table.index)
    assert "other processes used" in table.loc[HOGGED, "disturbed"]  # the premise: the hogged run was left out
    # the hand-trained run stands: Snakemake trained only what was missing
    assert not (work / "logs" / "train" / f"{HOGGED}.log").exists()
    summary = json.loads((work / "results" / "summary.json").read_text())
    assert [plan["round"] for plan in summary["added_rounds"]] == [plan["round"] for plan in plans]
    text = (work / "results" / "summary.md").read_text()
    assert "## Repeats added where the ranking was undecided" in text
    assert f"- round {plans[-1]['round']}: no runs, as {plans[-1]['stopped']}" in text
    # and then nothing is left to do: the checkpoints' decisions stand
    assert "Nothing to be done" in run(["snakemake", "-n"], work).stdout
