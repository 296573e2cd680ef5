"""A run trained while other processes hog the CPUs: collect flags it, keeps it out of every
statistic and claim, still shows it, and refuses the study when study.max_disturbed says so."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil

import pandas as pd
import pytest
import yaml

from gpt2dist.config.presets import load_params
from gpt2dist.pipeline.jobs import collect_command, report_command, train_command
from gpt2dist.pipeline.study import plan_study

from conftest import QUIET_WAIT_S, copy_of_study
from reduced_study import UNJUDGED, hog, run as run_in

pytestmark = [pytest.mark.slow, pytest.mark.alone]  # its runs' disturbance flags count

HOGGED = "single-fp32-n1-r1"


def intervals(markdown: str) -> list[tuple[float, float, float]]:
    """Every 'centre (low to high)' in the summary table."""
    number = r"(-?[\d,]+(?:\.\d+)?)"
    found = re.findall(rf"{number} \({number} to {number}\)", markdown)
    return [tuple(float(x.replace(",", "")) for x in match) for match in found]


@pytest.fixture(scope="module")
def disturbed_study(finished_study, tmp_path_factory):
    """The finished reduced study with one run trained again beside a hog on every CPU, judged by the preset's
    limits (the finished study, made beside other tests, judges none of its runs)."""
    work = copy_of_study(finished_study, tmp_path_factory.mktemp("disturbed") / "study")
    params = yaml.safe_load((work / "params.yaml").read_text())
    for limit in UNJUDGED:
        del params["presets"]["cpu"]["study"][limit]
    (work / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    study = plan_study(load_params(work / "params.yaml"), "cpu", 0)
    hogged = next(r for r in study.runs if r.run_id == HOGGED)
    shutil.rmtree(work / "results" / "runs" / HOGGED)
    hogs = [hog(240) for _ in range(len(os.sched_getaffinity(0)))]
    try:
        run_in(shlex.split(train_command(study, hogged)), work)
    finally:
        for process in hogs:
            process.kill()
            process.wait()
    for command in (collect_command(study), report_command()):
        run_in(shlex.split(command), work)
    return work


@pytest.mark.timeout(600)
def test_the_hogged_run_is_flagged_and_left_out(disturbed_study):
    results = disturbed_study / "results"
    runs = pd.read_csv(results / "runs.csv").set_index("run_id")
    assert "other processes used" in runs.loc[HOGGED, "disturbed"]
    assert runs.loc[HOGGED, "foreign_cpu_share"] > 0.3
    # the run waited for a quiet machine, as long as it waits and no longer, then trained and said so
    record = json.loads((results / "runs" / HOGGED / "run.json").read_text())
    assert QUIET_WAIT_S <= record["conditions"]["waited_for_quiet_s"] < QUIET_WAIT_S + 2
    summary = json.loads((results / "summary.json").read_text())
    assert HOGGED in summary["disturbed_runs"]
    single = summary["configs"]["single-fp32-n1"]
    # tiny runs on a busy CI machine may be flagged too: then single is summarised from them all, and says so
    assert single["disturbed_runs"] >= 1
    assert single["repeats"] + single["disturbed_runs"] == 2 or (single["from_disturbed"] and single["repeats"] == 2)
    markdown = (results / "summary.md").read_text()
    assert f"`{HOGGED}`" in markdown.split("| strategy")[0]  # named above the table
    for centre, low, high in intervals(markdown):
        assert 0 <= low <= centre <= high, (centre, low, high)
    # no claim cites the hogged round: the equal-loss check pairs rounds of undisturbed runs only
    assert not any("single-fp32-n1 r1" in finding["statistic"] for finding in summary["findings"])


@pytest.mark.timeout(300)
def test_max_disturbed_refuses_and_names_the_rerun_command(disturbed_study):
    params = yaml.safe_load((disturbed_study / "params.yaml").read_text())
    params["presets"]["cpu"]["study"]["max_disturbed"] = 0
    (disturbed_study / "strict.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    study = plan_study(load_params(disturbed_study / "strict.yaml"), "cpu", 0)
    done = run_in(shlex.split(collect_command(study, "strict.yaml")), disturbed_study, check=False)
    assert done.returncode == 2
    error = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(error) == 1 and HOGGED in error[0]
    assert "snakemake --cores all --forcerun " in error[0] and f" results/runs/{HOGGED}/run.json" in error[0]
