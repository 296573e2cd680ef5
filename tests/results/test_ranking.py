"""The answer that opens summary.md: per placement, configurations in tiers by throughput, each one's ratio
to the top one paired by repeat round and corrected for the placement's comparisons, a single fastest only
beyond the noise of every other, in words where the data gives no number."""

from __future__ import annotations

import math
import re

import pandas as pd
import pytest

from gpt2dist.results.ranking import answer_markdown, rank
from gpt2dist.results.statistics import log_interval


def study(per_round: dict[str, list[float]], disturbed: dict[str, set[int]] | None = None):
    """runs and summary frames as collect makes them, for two-process configurations on one machine."""
    disturbed = disturbed or {}
    runs = pd.DataFrame([{"config_id": config, "strategy": config.split("-")[0], "precision": "fp32",
                          "nproc": int(config.rsplit("-n", 1)[1]),
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


def test_configurations_that_cannot_be_told_apart_share_the_top_tier_and_none_is_called_fastest():
    runs, summary = study({"ddp-fp32-n2": [100, 110, 105], "fsdp-fp32-n2": [70, 77, 74],
                           "horovod-fp32-n2": [101, 104, 106]})
    (group,) = rank(runs, summary)
    assert [row["config_id"] for row in group["ranked"]] == ["ddp-fp32-n2", "horovod-fp32-n2", "fsdp-fp32-n2"]
    assert [row["tier"] for row in group["ranked"]] == [1, 1, 2]
    fsdp = group["ranked"][2]
    assert fsdp["vs_fastest"] == pytest.approx(math.exp(sum(math.log(x) for x in (0.70, 0.70, 74 / 105)) / 3))
    assert fsdp["gap"] == "slower" and group["ranked"][1]["gap"] == "not distinguishable"
    text = answer_markdown([group])
    assert "the top tier holds 2 configurations that cannot be told apart: ddp fp32, horovod fp32" in text
    assert "fastest is" not in text
    assert "- tier 2, slower than ddp fp32 beyond the noise:\n  - fsdp fp32: 0.70 (" in text


def test_a_single_fastest_is_named_only_beyond_the_noise_of_every_other():
    runs, summary = study({"ddp-fp32-n2": [100, 110, 105], "fsdp-fp32-n2": [70, 77, 74]})
    text = answer_markdown(rank(runs, summary))
    assert "fastest is **ddp fp32** at " in text and "beyond the noise of every other configuration here" in text


def test_tiers_follow_each_tiers_own_top():
    """c is below a but not below b: it joins b's tier, not a third one."""
    runs, summary = study({"a-n2": [100, 101, 102], "b-n2": [80, 81, 82], "c-n2": [78, 82, 80]})
    (group,) = rank(runs, summary)
    assert {row["config_id"]: row["tier"] for row in group["ranked"]} == {"a-n2": 1, "b-n2": 2, "c-n2": 2}
    assert "- tier 2, slower than a fp32 beyond the noise:\n  - b fp32: " in answer_markdown([group])


def test_the_intervals_widen_with_the_number_of_comparisons():
    """b is 0.92 of a, round by round: beyond the noise as one comparison, not among four."""
    pair = {"a-n2": [100, 100, 100], "b-n2": [90, 92, 94]}
    (alone,) = rank(*study(pair))
    assert alone["level"] == pytest.approx(0.95)
    assert {row["config_id"]: row["tier"] for row in alone["ranked"]} == {"a-n2": 1, "b-n2": 2}
    crowd = pair | {f"{name}-n2": [50, 51, 52] for name in ("c", "d", "e")}
    (among,) = rank(*study(crowd))
    assert among["level"] == pytest.approx(1 - 0.05 / 4)
    assert next(row for row in among["ranked"] if row["config_id"] == "b-n2")["tier"] == 1
    assert "(Bonferroni: 98.8% each, so 95% for the placement as a whole)" in answer_markdown([among])


def test_dataparallel_over_one_device_is_said_to_be_singles_computation():
    runs, summary = study({"single-n1": [100, 101, 102], "dp-n1": [97, 99, 101]})
    (group,) = rank(runs, summary)
    assert {row["config_id"]: row["same_as"] for row in group["ranked"]} == {"single-n1": None, "dp-n1": "single-n1"}
    assert "- dp fp32 (single fp32's computation, in DataParallel over one device): " in answer_markdown([group])
    # where it is the highest on average it still does not head the placement: single does, and it follows as
    # single's computation, which its ratio to single measures
    (ahead,) = rank(*study({"single-n1": [97, 99, 101], "dp-n1": [100, 101, 102]}))
    assert [row["config_id"] for row in ahead["ranked"]] == ["single-n1", "dp-n1"]
    text = answer_markdown([ahead])
    assert "At its head, as the computation that DataParallel over one device wraps: single fp32 at " in text
    assert "Highest on average" not in text  # which it is not
    assert "- dp fp32 (single fp32's computation, in DataParallel over one device): 1.0" in answer_markdown([ahead])
    # the control: at two processes DataParallel is a rival of its own
    (two,) = rank(*study({"ddp-n2": [100, 101, 102], "dp-n2": [97, 99, 101]}))
    assert all(row["same_as"] is None for row in two["ranked"])
    assert "computation, in DataParallel" not in answer_markdown([two])


def test_too_few_or_only_disturbed_repeats_are_said_in_words_never_nan():
    runs, summary = study({"ddp-fp32-n2": [100, 110, 105], "fsdp-fp32-n2": [70, 77, 74], "tp-fp32-n2": [40, 44, 42]},
                          disturbed={"fsdp-fp32-n2": {0, 1}, "tp-fp32-n2": {0, 1, 2}})
    (group,) = rank(runs, summary)
    gaps = {row["config_id"]: row["gap"] for row in group["ranked"]}
    assert gaps == {"ddp-fp32-n2": "fastest", "fsdp-fp32-n2": "too few repeats", "tp-fp32-n2": "only disturbed runs"}
    assert [row["tier"] for row in group["ranked"]] == [1, None, None]
    text = answer_markdown([group])
    assert "nothing here can be placed against it" in text and "- not placed:" in text
    assert "nan" not in text.lower()
    assert "one undisturbed pair, so no interval; run more repeats" in text
    assert "measured only on a disturbed machine; re-run it quietly" in text
    # the data does hold a missing bound, which plain number formatting would print as nan
    fsdp = next(row for row in group["ranked"] if row["config_id"] == "fsdp-fp32-n2")
    assert fsdp["vs_fastest"] == pytest.approx(74 / 105) and fsdp["vs_fastest_ci_low"] is None


def test_a_configuration_run_once_by_plan_is_not_told_to_run_more():
    """A study may plan one repeat of a row (cpu-emulated-bf16 once did for its bf16 rows, an emulated bf16 step
    costing ten fp32 ones): the answer says the plan made it unplaceable and how to change it, not 'run more' as if
    the machine had failed it. The
    control: one repeat left because the others were disturbed still asks for more."""
    runs, summary = study({"ddp-fp32-n2": [100, 110, 105], "fsdp-fp32-n2": [70]})
    summary["planned_repeats"] = summary["config_id"].map({"ddp-fp32-n2": 3, "fsdp-fp32-n2": 1})
    (group,) = rank(runs, summary)
    fsdp = group["ranked"][1]
    assert fsdp["gap"] == "one repeat planned" and fsdp["tier"] is None, fsdp
    text = answer_markdown([group])
    assert "run once, as the study plans it, so it cannot be placed (give its run group `repeats: 2`" in text
    assert "run more" not in text and "(one run each, no interval)" in text, text
    summary["planned_repeats"] = 3
    (lost,) = rank(runs, summary)
    assert lost["ranked"][1]["gap"] == "too few repeats"


def test_a_configuration_run_once_without_a_partner_in_its_round_says_so():
    """The top configuration's run of the same round left out (disturbed): no ratio to give, and the answer says
    why instead of failing (a fresh AVX2 study's report once ended in a TypeError here)."""
    runs, summary = study({"ddp-fp32-n2": [100, 110, 105], "fsdp-fp32-n2": [70]}, disturbed={"ddp-fp32-n2": {0}})
    summary["planned_repeats"] = summary["config_id"].map({"ddp-fp32-n2": 3, "fsdp-fp32-n2": 1})
    (group,) = rank(runs, summary)
    fsdp = group["ranked"][1]
    assert fsdp["gap"] == "one repeat planned" and fsdp["vs_fastest"] is None, fsdp
    assert "- fsdp fp32: not measured (no undisturbed pair of runs" in answer_markdown([group])
    # control: with its partner undisturbed, the one pair gives a ratio
    runs, summary = study({"ddp-fp32-n2": [100, 110, 105], "fsdp-fp32-n2": [70]})
    summary["planned_repeats"] = summary["config_id"].map({"ddp-fp32-n2": 3, "fsdp-fp32-n2": 1})
    assert "- fsdp fp32: 0.70 (one run each, no interval)" in answer_markdown(rank(runs, summary))


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
    # a configuration whose traced steps were not slower gets no reason from them
    summary.loc[summary["config_id"] == "fsdp-fp32-n2", parts] = [(0.060, 0.010, 0.005, 0.00101, 0.020)]
    (same,) = rank(runs, summary)
    assert "its traced steps were not measurably slower than ddp fp32's" in answer_markdown([same])
    assert "+0.0 ms" not in answer_markdown([same])
    assert "ms compute" not in answer_markdown([group])
    # the control: without a ledger (runs made before it existed) the answer claims no reason
    (bare,) = rank(*study({"ddp-fp32-n2": [100, 110, 105], "fsdp-fp32-n2": [70, 77, 74]}))
    assert "per step it spends" not in answer_markdown([bare])


def test_two_pairs_give_no_interval_in_numbers_but_in_words():
    """With two pairs the interval has one degree of freedom and, corrected for the placement's comparisons, spans
    orders of magnitude ('0.00 to 271790.49' in a study here): the answer says why there is none. The control:
    three pairs print their interval."""
    runs, summary = study({"ddp-fp32-n2": [100, 110], "fsdp-fp32-n2": [98, 111], "tp-fp32-n2": [97, 108]})
    text = answer_markdown(rank(runs, summary))
    assert text.count("(2 pairs of runs: too few for a useful interval at this level)") == 2, text
    assert "the interval includes 1" not in text  # the interval it has just said it lacks
    assert text.count("not distinguishable from it with 2 pairs (run more repeats to tell)") == 2, text
    runs, summary = study({"ddp-fp32-n2": [100, 110, 105], "fsdp-fp32-n2": [98, 111, 104]})
    assert "too few for a useful interval" not in answer_markdown(rank(runs, summary))


def contradictions(text: str) -> list[str]:
    """Sentences that cite an interval ("the interval includes 1") without giving one, or after saying there is none."""
    sentences = [part for line in text.splitlines() for part in re.split(r"(?<=\.) (?=[A-Z])", line)]
    return [sentence for sentence in sentences if "interval includes" in sentence and (
        "no interval" in sentence or "too few for a useful interval" in sentence
        or not re.search(r"\([\d.,]+ to [\d.,]+\)", sentence))]


# each a study whose answer has its own kinds of verdict: 2 and 3 pairs, within a placement and against the study's
# fastest, one run, a disturbed one
VERDICT_STUDIES = {
    "two-pairs": ({"ddp-fp32-n1": [100, 125], "single-fp32-n1": [99, 121], "ddp-fp32-n2": [112, 104],
                   "fsdp-fp32-n2": [70, 75]}, {}),
    "three-pairs": ({"ddp-fp32-n1": [100, 125, 90], "single-fp32-n1": [99, 121, 93], "ddp-fp32-n2": [112, 104, 95],
                     "fsdp-fp32-n2": [70, 75, 72], "tp-fp32-n2": [110, 100, 99]}, {}),
    "one-run": ({"ddp-fp32-n1": [100], "ddp-fp32-n2": [101, 111, 104]}, {}),
    "disturbed": ({"ddp-fp32-n2": [100, 110, 105], "fsdp-fp32-n2": [98, 111, 104]}, {"fsdp-fp32-n2": {0, 1, 2}}),
}


@pytest.mark.parametrize("name", VERDICT_STUDIES)
def test_no_sentence_of_the_answer_cites_an_interval_it_does_not_have(name):
    """Over every kind of verdict, in a placement's lines and in its sentence against the study's fastest (where
    '2 pairs ... too few for a useful interval ... the interval includes 1' once stood side by side)."""
    per_round, disturbed = VERDICT_STUDIES[name]
    groups = rank(*study(per_round, disturbed))
    text = answer_markdown(groups)
    assert contradictions(text) == [], text
    if name == "two-pairs":  # the case that contradicted itself, in both places
        assert [group["vs_study_fastest"]["gap"] for group in groups if group.get("vs_study_fastest")] == \
            ["not distinguishable"]
        assert "of the study's fastest, ddp-fp32-n1: not distinguishable from it with 2 pairs (run more" in text
        assert "- single fp32: 0.98 (2 pairs of runs: too few for a useful interval at this level) of ddp fp32, not " \
               "distinguishable from it with 2 pairs" in text
    # the control: the old wording of that sentence is caught
    assert contradictions("That is 0.95 (2 pairs of runs: too few for a useful interval at this level) of the "
                          "study's fastest: not distinguishable from it (the interval includes 1).")
