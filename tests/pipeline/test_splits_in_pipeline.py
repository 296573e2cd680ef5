"""A study with splits through the whole pipeline (Snakemake: training, collect, figures, report): their run ids
name the degrees, collect holds each split's model state to its prediction and its traffic by group, and the
answer places them in its tiers beside the named strategies."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import yaml

from reduced_study import UNJUDGED, copy_workflow, run

pytestmark = pytest.mark.slow

# a replica split into a pipeline of 2 beside plain ddp on as many processes (the splits' runs on 4 and 8 ranks are
# test_splits.py's: the pipeline's part is the study's ids, tables, tiers and figures)
GROUPS = [{"strategies": ["single"], "precisions": ["fp32"], "nproc": [1]},
          {"strategies": ["ddp", "ddp-pp2"], "precisions": ["fp32"], "nproc": [2]}]
IDS = ["ddp-fp32-n2", "ddp-pp2-fp32-n2", "single-fp32-n1"]


@pytest.fixture(scope="module")
def split_study(tmp_path_factory):
    # one repeat, no selftests, no run judged disturbed (it runs beside other tests): what is checked is where the
    # splits' numbers go, not their intervals; two blocks, one per stage
    work = copy_workflow(tmp_path_factory.mktemp("splits"), runs=GROUPS, repeats=1, selftests=False, **UNJUDGED)
    params = yaml.safe_load((work / "params.yaml").read_text())
    params["presets"]["cpu"]["model"]["n_layer"] = 2
    (work / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    run(["snakemake", "--cores", "2"], work)
    return work / "results"


@pytest.mark.timeout(900)
def test_a_study_of_splits_names_their_degrees_and_places_them_in_its_tiers(split_study):
    summary = pd.read_csv(split_study / "summary.csv").set_index("config_id")
    assert sorted(summary.index) == IDS
    assert sorted(p.name for p in (split_study / "runs").iterdir()) == [f"{config}-r0" for config in IDS]
    # collect's prediction of each split's model state is what its rank 0 held, to the byte
    assert (summary["predicted_model_state_bytes"] == summary["model_state_bytes"]).all()
    record = json.loads((split_study / "runs" / "ddp-pp2-fp32-n2-r0" / "run.json").read_text())
    assert record["placement"]["groups"] == {"pp": [[0, 1]]}
    assert [part["group"] for part in record["communication"]["parts"]] == ["pp"]  # one replica: no data parallel
    answer = json.loads((split_study / "summary.json").read_text())["answer"]
    ranked = {group["placement"]: {row["config_id"] for row in group["ranked"]} for group in answer}
    assert ranked["2 processes on one machine"] == {"ddp-fp32-n2", "ddp-pp2-fp32-n2"}
    report = (split_study / "summary.md").read_text()
    assert "ddp-pp2 fp32" in report and "| ddp-pp2 " in report
    assert all((split_study / "figures" / f"{name}.png").stat().st_size > 0
               for name in ("throughput", "scaling", "time_ledger"))
