"""Which configurations an added round repeats: those whose place more runs could settle, beside their
placement's top, within the study's budget; tied, slower-beyond-noise and twin configurations are left alone."""

from __future__ import annotations

import pytest
import yaml
from test_ranking import study

from conftest import REPO
from gpt2dist.pipeline.study import plan_study, run_of, with_added_runs
from gpt2dist.results.added_repeats import plan_round, undecided
from gpt2dist.config.presets import load_params
from gpt2dist.results.ranking import rank

PLACEMENT = "2 processes on one machine"
NOISY = {"ddp-fp32-n2": [100, 110, 105], "horovod-fp32-n2": [60, 140, 100], "fsdp-fp32-n2": [70, 77, 74],
         "tp-fp32-n2": [100.1, 109.8, 105.0]}


def test_undecided_are_those_whose_interval_holds_both_a_tie_and_a_gap_worth_settling():
    runs, summary = study(NOISY)
    (group,) = rank(runs, summary)
    gaps = {row["config_id"]: row["gap"] for row in group["ranked"]}
    assert gaps["horovod-fp32-n2"] == gaps["tp-fp32-n2"] == "not distinguishable" and gaps["fsdp-fp32-n2"] == "slower"
    # horovod's interval runs from far below to above 1; tp's lies within 5% of ddp's (tied); fsdp is placed
    assert undecided([group], resolve=0.05) == {PLACEMENT: ["ddp-fp32-n2", "horovod-fp32-n2"]}
    # control: asking to settle only gaps of 90% or more, horovod's interval no longer reaches one
    assert undecided([group], resolve=0.9) == {}
    # a configuration without an undisturbed pair is open too
    runs, summary = study({**NOISY, "horovod-fp32-n2": [60]})
    assert undecided(rank(runs, summary), resolve=0.05) == {PLACEMENT: ["ddp-fp32-n2", "horovod-fp32-n2"]}


@pytest.fixture
def budgeted(tmp_path):
    """The cpu study with added rounds and a budget set in its params."""
    def make(**added):
        params = yaml.safe_load((REPO / "params.yaml").read_text())
        params["presets"]["cpu"]["study"]["added_repeats"] = added
        path = tmp_path / "params.yaml"
        path.write_text(yaml.safe_dump(params))
        return plan_study(load_params(path), "cpu", 0)
    return make


def test_a_round_repeats_the_undecided_beside_their_top_until_the_budget_is_spent(budgeted):
    runs, summary = study({**NOISY, "pp-fp32-n2": [50, 120, 100]})
    answer = rank(runs, summary)
    minutes = dict.fromkeys(summary["config_id"], 0.5)
    plan = plan_round(budgeted(rounds=2, max_runs=10), 1, answer, {"runs": 0, "minutes": 0.0}, minutes)
    assert plan["runs"] == ["ddp-fp32-n2-r3", "horovod-fp32-n2-r3", "pp-fp32-n2-r3"] and plan["stopped"] is None
    assert plan["spent"] == {"runs": 3, "minutes": 1.5}
    # two runs left: the top and one of its rivals; the other waits, named
    plan = plan_round(budgeted(rounds=2, max_runs=10), 2, answer, {"runs": 8, "minutes": 0.0}, minutes)
    assert plan["runs"] == ["ddp-fp32-n2-r3", "horovod-fp32-n2-r3"] and plan["left_out"] == {PLACEMENT: ["pp-fp32-n2"]}
    # by time: one minute left holds two half-minute runs
    plan = plan_round(budgeted(rounds=2, max_minutes=3), 2, answer, {"runs": 0, "minutes": 2.0}, minutes)
    assert len(plan["runs"]) == 2
    # one run left cannot pair a rival with its top: the rounds stop, and say why
    plan = plan_round(budgeted(rounds=2, max_runs=10), 2, answer, {"runs": 9, "minutes": 0.0}, minutes)
    assert plan["runs"] == [] and plan["stopped"].startswith("the budget is spent")
    # nothing open: nothing added
    runs, summary = study({"ddp-fp32-n2": [100, 110, 105], "fsdp-fp32-n2": [70, 77, 74]})
    plan = plan_round(budgeted(rounds=2, max_runs=10), 1, rank(runs, summary), {"runs": 0, "minutes": 0.0}, minutes)
    assert plan["runs"] == [] and plan["stopped"] == "every configuration is placed or tied"


def test_added_runs_join_the_study_from_the_rounds_written(budgeted, tmp_path):
    planned = budgeted(rounds=2, max_runs=10)
    (tmp_path / "rounds").mkdir()
    (tmp_path / "rounds" / "added-1.json").write_text('{"runs": ["ddp-fp32-n2-r3", "fsdp-fp32-n2-r3"]}')
    grown = with_added_runs(planned, tmp_path)
    assert [run.run_id for run in grown.runs[len(planned.runs):]] == ["ddp-fp32-n2-r3", "fsdp-fp32-n2-r3"]
    assert run_of(planned, "ddp-fp32-n2-r3") == grown.runs[-2]
    assert with_added_runs(planned, tmp_path, upto=0).runs == planned.runs
    (tmp_path / "rounds" / "added-1.json").write_text("{")
    with pytest.raises(Exception, match="added-1.json is damaged"):
        with_added_runs(planned, tmp_path)
    with pytest.raises(Exception, match="is no run of preset"):
        run_of(planned, "apex-ddp-fp32-n2-r3")


def test_added_rounds_need_a_budget(budgeted):
    with pytest.raises(Exception, match="needs a budget"):
        budgeted(rounds=2)


def test_halving_drops_the_placed_and_repeats_the_undecided_and_without_it_every_configuration_runs(budgeted):
    """The tune's rounds (gpt2dist tune): after a round, a configuration slower than the top beyond the noise (fsdp)
    and one tied within `resolve` (tp) are not run again, while the undecided one (horovod) is, beside the top; the
    control, without halving, runs every configuration of the placement again, fsdp and tp included."""
    runs, summary = study(NOISY)
    answer = rank(runs, summary)
    minutes = dict.fromkeys(summary["config_id"], 0.5)
    halved = plan_round(budgeted(rounds=2, max_runs=10), 1, answer, {"runs": 0, "minutes": 0.0}, minutes)
    assert halved["runs"] == ["ddp-fp32-n2-r3", "horovod-fp32-n2-r3"]
    assert halved["gaps"][PLACEMENT]["fsdp-fp32-n2"] == "slower"  # what the tune's rounds say was dropped, and why
    every = plan_round(budgeted(rounds=2, max_runs=10, halving=False), 1, answer, {"runs": 0, "minutes": 0.0}, minutes)
    assert sorted(every["runs"]) == sorted(f"{config}-r3" for config in NOISY)
    assert every["undecided"] == halved["undecided"]  # what is undecided does not depend on what is run
    # nothing undecided: without halving too, no round (the control runs every candidate while a round is wanted)
    runs, summary = study({"ddp-fp32-n2": [100, 110, 105], "fsdp-fp32-n2": [70, 77, 74]})
    done = plan_round(budgeted(rounds=2, max_runs=10, halving=False), 1, rank(runs, summary),
                      {"runs": 0, "minutes": 0.0}, minutes)
    assert done["runs"] == [] and done["stopped"] == "every configuration is placed or tied"


def test_a_budget_of_the_whole_study_counts_the_planned_runs_too(budgeted):
    """max_study_minutes bounds every run of the study, planned and added (a tune's budget): a round fits what the
    runs so far left of it, and stops naming what they took; the control: the same runs with time left."""
    runs, summary = study({**NOISY, "pp-fp32-n2": [50, 120, 100]})
    answer = rank(runs, summary)
    minutes = dict.fromkeys(summary["config_id"], 0.5)
    fits = plan_round(budgeted(rounds=2, max_study_minutes=10), 1, answer, {"runs": 0, "minutes": 0.0}, minutes, 8.0)
    assert len(fits["runs"]) == 3  # 1.5 minutes of runs within the 2 left
    tight = plan_round(budgeted(rounds=2, max_study_minutes=10), 1, answer, {"runs": 0, "minutes": 0.0}, minutes, 9.0)
    assert tight["runs"] == ["ddp-fp32-n2-r3", "horovod-fp32-n2-r3"] and tight["left_out"] == {PLACEMENT: ["pp-fp32-n2"]}
    spent = plan_round(budgeted(rounds=2, max_study_minutes=10), 1, answer, {"runs": 0, "minutes": 0.0}, minutes, 9.8)
    assert spent["runs"] == [] and spent["stopped"] == (
        "the budget is spent (0 runs, 0.0 minutes added; the study's runs took 9.8 of its 10 minutes)")
