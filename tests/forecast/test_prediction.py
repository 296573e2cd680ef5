"""Predictions beside the measurements that check them (forecast.prediction): the step-time model by hand,
and the reference studies' summaries carrying both predictions with errors recomputed from their bundles."""

from __future__ import annotations

import json
import math
import tarfile

import pandas as pd
import pytest

from gpt2dist.config.presets import load_params
from gpt2dist.config.schema import TrainConfig
from gpt2dist.forecast.prediction import STEP_TARGET, predicted_step_time, prediction_errors, with_predictions
from gpt2dist.results.report import prediction_markdown

from conftest import REPO, TINY_PRESET


def row(strategy: str, nproc: int, nodes: int = 1, emulated: bool = False, sent: float = 0.0,
        busbw: float = math.nan) -> dict:
    return {"strategy": strategy, "nproc": nproc, "nodes": nodes, "emulated": emulated, "comm_bytes_per_step": sent,
            "busbw_gb_s": busbw}


def test_the_step_model_by_hand():
    single = 0.1
    four = TrainConfig(**{**TINY_PRESET["train"], "global_batch_size": 8, "micro_batch_size": 2})  # 4 micro-batches
    # CPUs: two processes each do half the work on half the cores; 4 MB at 2 GB/s adds 2 ms
    assert predicted_step_time(row("ddp", 2, sent=4e6, busbw=2.0), single, "cpu", four) == pytest.approx(0.102)
    # emulated nodes share the machine; a cluster's nodes each bring their own cores
    assert predicted_step_time(row("ddp", 4, 2, emulated=True), single, "cpu", four) == pytest.approx(0.1)
    assert predicted_step_time(row("ddp", 4, 2), single, "cpu", four) == pytest.approx(0.05)
    # GPUs: a device each; a 2-stage pipeline over 4 micro-batches waits (4 + 2 - 1) / 4 of its compute
    assert predicted_step_time(row("ddp", 4), single, "cuda", four) == pytest.approx(0.025)
    assert predicted_step_time(row("pp", 2), single, "cuda", four) == pytest.approx(0.05 * 5 / 4)
    # interleaving 2 stages per rank halves that bubble: (4 + 1 / 2) / 4
    interleaved = four.model_copy(update={"pipeline_schedule": "interleaved-1f1b", "pipeline_virtual_stages": 2})
    assert predicted_step_time(row("pp", 2), single, "cuda", interleaved) == pytest.approx(0.05 * 4.5 / 4)
    assert math.isnan(predicted_step_time(row("ddp", 2), math.nan, "cpu", four))  # no single run to calibrate on


@pytest.fixture(scope="module", params=["cpu-study", "two-node-cpu", "two-node-splits-cpu"])
def rebuilt(request, tmp_path_factory) -> tuple[pd.DataFrame, TrainConfig]:
    """A reference study's summary (the committed one, which test_bundle.py holds equal to its bundle's rebuild),
    and its preset's train settings."""
    bundle, out = REPO / "docs" / "reference" / f"{request.param}.tar.gz", tmp_path_factory.mktemp(request.param)
    results = REPO / "docs" / "reference" / request.param
    with tarfile.open(bundle) as packed:
        (out / "params.yaml").write_bytes(packed.extractfile("params.yaml").read())
    preset = json.loads((results / "summary.json").read_text())["preset"]
    train = load_params(out / "params.yaml").preset(preset)[1].train
    return pd.read_csv(results / "summary.csv"), train


def test_every_configuration_carries_both_predictions_recomputed_from_its_bundle(rebuilt):
    rebuilt, train = rebuilt
    assert rebuilt["model_state_error"].abs().max() < 1e-9  # counted to the byte, on every configuration
    single = rebuilt[(rebuilt["strategy"] == "single") & (rebuilt["nproc"] == 1)].set_index("precision")["step_time_s"]
    for config in rebuilt.to_dict("records"):
        expected = predicted_step_time(config, single[config["precision"]], "cpu", train)
        assert config["predicted_step_time_s"] == pytest.approx(expected), config["config_id"]
        # the tables keep 10 significant digits (collect.CANONICAL_FLOAT): a ratio near 1 minus 1 keeps fewer
        assert config["step_time_error"] == pytest.approx(expected / config["step_time_s"] - 1, abs=1e-9)


def test_the_summary_names_the_strategies_beyond_the_target_from_the_errors(rebuilt):
    rebuilt, train = rebuilt
    section = prediction_markdown(rebuilt)
    errors = prediction_errors(rebuilt)
    beyond = errors.loc[errors["worst_step_error"].abs() > STEP_TARGET, "strategy"].tolist()
    assert (f"Beyond {STEP_TARGET:.0%} here: {', '.join(beyond)}." if beyond
            else f"Every strategy within {STEP_TARGET:.0%} here.") in section
    # control: measured steps set to the predicted ones leave no strategy beyond the target
    exact = with_predictions(rebuilt.assign(step_time_s=rebuilt["predicted_step_time_s"]), "cpu", train)
    assert f"Every strategy within {STEP_TARGET:.0%} here." in prediction_markdown(exact)
