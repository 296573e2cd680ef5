"""Time to the target loss and the numerics check (results.convergence): by hand, each verdict beside the case
that turns it, and on the reference study, recomputed from its metrics."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from gpt2dist.results.convergence import (
    TARGET_MARGIN,
    energy_per_token,
    needs_more_steps,
    target_loss,
    to_target,
)
from gpt2dist.results.report import convergence_markdown



def run_lines(val: dict[int, float], steps: int = 10, step_s: float = 0.5) -> pd.DataFrame:
    return pd.DataFrame({"step": range(steps), "step_time_s": [step_s] * steps}).merge(
        pd.DataFrame({"step": list(val), "val_loss": list(val.values())}), on="step", how="outer")


def test_a_run_is_timed_to_its_first_evaluation_at_or_below_the_target():
    run = run_lines({5: 3.0, 10: 2.0})
    assert to_target(run, 3.0) == (5, 2.5)  # the steps before the evaluation at step 5
    assert to_target(run, 2.5) == (10, 5.0)
    assert all(math.isnan(v) for v in to_target(run, 1.0))  # never reached
    table = pd.concat([run_lines({10: 2.0}).assign(run_id="a", strategy="single", precision="fp32"),
                       run_lines({10: 2.2}).assign(run_id="b", strategy="single", precision="fp32"),
                       run_lines({10: 9.0}).assign(run_id="c", strategy="ddp", precision="fp32")])
    assert target_loss(table, None) == pytest.approx(2.2 * (1 + TARGET_MARGIN))  # the worst reference, not ddp's
    assert target_loss(table, 1.5) == 1.5


@pytest.mark.parametrize("steps, reference, flagged", [
    ([10, 10, 10], [10, 10, 10], ""),
    ([20, 20, 20], [10, 10, 10], "needs more steps than single fp32 (every repeat)"),
    ([20, 20, 30], [10, 10, 10], "needs more steps than single fp32 (one-sided p = "),
    ([10, 20, 20], [10, 10, 10], ""),  # p = 0.09: not shown at the 5% level
    ([10, 10, 20], [10, 10, 10], ""),  # one slow repeat is within the noise of three
    ([20, math.nan, 20], [10, 10, 10], "1 of 3 repeats did not reach the target"),
    ([10, 10, 10], [20, 20, 20], ""),  # fewer steps is no fault
])
def test_the_numerics_check(steps, reference, flagged):
    said = needs_more_steps(pd.Series(steps, dtype=float), pd.Series(reference, dtype=float))
    assert said.startswith(flagged) and (said == "") == (flagged == "")


def test_energy_per_token_is_power_times_time_over_tokens_for_every_gpu():
    steps = pd.DataFrame({"power_w": [300.0, 500.0], "step_time_s": [0.1, 0.1]})
    assert energy_per_token(steps, 8, 1000) == pytest.approx((30 + 50) * 8 / 2000)
    assert math.isnan(energy_per_token(steps.drop(columns="power_w"), 8, 1000))  # CPUs report no power


def test_the_reference_study_times_every_run_to_its_target(reference_study):
    out = reference_study("cpu-study")
    target = json.loads((out / "summary.json").read_text())["target_val_loss"]
    metrics, runs = pd.read_csv(out / "metrics.csv"), pd.read_csv(out / "runs.csv").set_index("run_id")
    for run_id, run in metrics.groupby("run_id"):
        steps, seconds = to_target(run, target)
        assert runs.loc[run_id, "steps_to_target"] == steps and runs.loc[run_id, "time_to_target_s"] == pytest.approx(seconds)
    assert runs["steps_to_target"].notna().all()  # the default target: every run reaches it
    summary = (out / "summary.md").read_text()
    assert f"at or below a validation loss of {target:.4f}" in summary
    # every run reached the default target at its first evaluation: one sentence says so instead of 20 equal rows
    assert "Every configuration reached the target in each repeat counted, at step 10, its first evaluation" in summary


def test_a_table_says_what_it_left_out_and_equal_rows_become_a_sentence():
    configs = pd.DataFrame({"strategy": ["single", "ddp"], "precision": ["fp32"] * 2, "nproc": [1, 2],
                            "reached_target": [3, 3], "repeats": [3, 3], "steps_to_target": [10.0, 20.0],
                            "time_to_target_s": [1.0, 1.5], "time_to_target_s_ci_low": [0.9, 1.4],
                            "time_to_target_s_ci_high": [1.1, 1.6], "energy_to_target_j": [math.nan] * 2,
                            "numerics": ["", ""]})
    text = convergence_markdown(configs, 5.0)
    assert "Left out, as no row has a value: energy to the target (only GPUs report power)." in text
    assert "J to target" not in text and "| ddp " in text
    # the control: the same steps everywhere is one sentence, not a table
    same = convergence_markdown(configs.assign(steps_to_target=10.0), 5.0)
    assert "Every configuration reached the target in each repeat counted, at step 10" in same and "| ddp " not in same
