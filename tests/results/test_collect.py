"""Summary statistics: which run a configuration's speedup is measured against."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from gpt2dist.pipeline.study import parse_run_id, plan_study
from gpt2dist.results.collect import SUMMARISED, baseline_of, summarise

from conftest import REPO


def test_baseline_is_the_one_process_run_of_the_same_precision():
    configs = {"single-fp32-n1", "ddp-apex-O1-n1", "ddp-apex-O1-n2", "horovod-fp16-n2"}
    assert baseline_of("ddp", "fp32", configs) == "single-fp32-n1"
    assert baseline_of("ddp", "apex-O1", configs) == "ddp-apex-O1-n1"  # no single apex run: ddp's own n=1
    assert baseline_of("horovod", "apex-O1", configs) is None  # never another strategy's or precision's
    assert baseline_of("horovod", "fp16", configs) is None  # never fp32: that would count fp16's gain as scaling


def test_summary_says_when_there_is_no_baseline():
    rates = {"single-fp32-n1": 100.0, "ddp-fp32-n2": 180.0, "ddp-apex-O1-n1": 300.0, "ddp-apex-O1-n2": 540.0,
             "horovod-fp16-n2": 400.0}
    rows = []
    for config, rate in rates.items():
        run = parse_run_id(f"{config}-r0")
        rows += [{"config_id": config, "strategy": run.strategy, "precision": run.precision, "nproc": run.nproc,
                  **dict.fromkeys(SUMMARISED, rate)} for _ in range(2)]
    study = plan_study(REPO / "params.yaml", "cpu", 0)
    summary = summarise(pd.DataFrame(rows), study, None).set_index("config_id")
    assert summary.loc["ddp-fp32-n2", "speedup"] == pytest.approx(1.8)
    assert summary.loc["ddp-apex-O1-n2", "speedup"] == pytest.approx(1.8)
    assert summary.loc["ddp-apex-O1-n1", "scaling_efficiency"] == pytest.approx(1.0)  # not 3.0: fp16 is no scaling
    assert pd.isna(summary.loc["horovod-fp16-n2", "baseline"]) and math.isnan(summary.loc["horovod-fp16-n2", "speedup"])
