"""The answer that opens summary.md: per placement, configurations ranked by throughput, each one's ratio
to the fastest paired by repeat round, in words where the data gives no number."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from gpt2dist.results.ranking import answer_markdown, rank
from gpt2dist.results.statistics import log_interval


def study(per_round: dict[str, list[float]], disturbed: dict[str, set[int]] | None = None):
    """runs and summary frames as collect makes them, for two-process configurations on one machine."""
    disturbed = disturbed or {}
    runs = pd.DataFrame([{"config_id": config, "strategy": config.split("-")[0], "precision": "fp32", "nproc": 2,
                          "nodes": 1, "link_mbit": math.nan, "repeat": repeat, "tokens_per_s": value,
                          "disturbed": "load" if repeat in disturbed.get(config, ()) else ""}
                         for config, values in per_round.items() for repeat, value in enumerate(values)])
    rows = []
    for config, group in runs.groupby("config_id"):
        quiet = group[group["disturbed"] == ""]
        chosen = quiet if len(quiet) else group
        centre, low, high = log_interval(chosen["tokens_per_s"])
        rows.append({**group.iloc[0][["config_id", "strategy", "precision", "nproc", "nodes", "link_mbit"]],
                     "tokens_per_s": centre, "tokens_per_s_ci_low": low, "tokens_per_s_ci_high": high,
                     "repeats": len(chosen), "from_disturbed": quiet.empty})
    return runs, pd.DataFrame(rows)


def test_the_fastest_comes_first_and_the_others_are_paired_ratios():
    runs, summary = study({"ddp-fp32-n2": [100, 110, 105], "fsdp-fp32-n2": [70, 77, 74],
                           "horovod-fp32-n2": [101, 104, 106]})
    (group,) = rank(runs, summary)
    assert [row["config_id"] for row in group["ranked"]] == ["ddp-fp32-n2", "horovod-fp32-n2", "fsdp-fp32-n2"]
    fsdp = group["ranked"][2]
    assert fsdp["vs_fastest"] == pytest.approx(math.exp(sum(math.log(x) for x in (0.70, 0.70, 74 / 105)) / 3))
    assert fsdp["gap"] == "slower" and group["ranked"][1]["gap"] == "not distinguishable"
    text = answer_markdown([group])
    assert "fastest is **ddp fp32**" in text and "fsdp fp32: 0.70 (" in text and "slower, beyond the noise" in text


def test_too_few_or_only_disturbed_repeats_are_said_in_words_never_nan():
    runs, summary = study({"ddp-fp32-n2": [100, 110, 105], "fsdp-fp32-n2": [70, 77, 74], "tp-fp32-n2": [40, 44, 42]},
                          disturbed={"fsdp-fp32-n2": {0, 1}, "tp-fp32-n2": {0, 1, 2}})
    (group,) = rank(runs, summary)
    gaps = {row["config_id"]: row["gap"] for row in group["ranked"]}
    assert gaps == {"ddp-fp32-n2": "fastest", "fsdp-fp32-n2": "too few repeats", "tp-fp32-n2": "only disturbed runs"}
    text = answer_markdown([group])
    assert "nan" not in text.lower()
    assert "one undisturbed pair, so no interval; run more repeats" in text
    assert "measured only on a disturbed machine; re-run it quietly" in text
    # the data does hold a missing bound, which plain number formatting would print as nan
    fsdp = next(row for row in group["ranked"] if row["config_id"] == "fsdp-fp32-n2")
    assert fsdp["vs_fastest"] == pytest.approx(74 / 105) and fsdp["vs_fastest_ci_low"] is None


def test_a_slower_configuration_says_which_parts_of_its_step_take_longer():
    runs, summary = study({"ddp-fp32-n2": [100, 110, 105], "fsdp-fp32-n2": [70, 77, 74]})
    ledgers = {"ddp-fp32-n2": (0.060, 0.010, 0.005, 0.001, 0.020), "fsdp-fp32-n2": (0.062, 0.004, 0.040, 0.001, 0.031)}
    parts = ["ledger_compute_s", "ledger_comm_hidden_s", "ledger_comm_exposed_s", "ledger_data_s", "ledger_idle_s"]
    summary[parts] = [ledgers[config] for config in summary["config_id"]]
    (group,) = rank(runs, summary)
    fsdp = group["ranked"][1]
    assert fsdp["ledger_gap_s"]["comm_exposed_s"] == pytest.approx(0.035)
    # the gap is mostly exposed communication (+35 ms), then idle (+11 ms); +2 ms compute is too small to name
    assert "per step it spends +35.0 ms exposed communication, +11.0 ms idle" in answer_markdown([group])
    assert "ms compute" not in answer_markdown([group])
    # the control: without a ledger (runs made before it existed) the answer claims no reason
    (bare,) = rank(*study({"ddp-fp32-n2": [100, 110, 105], "fsdp-fp32-n2": [70, 77, 74]}))
    assert "per step it spends" not in answer_markdown([bare])
