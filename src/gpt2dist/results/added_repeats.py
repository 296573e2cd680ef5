"""Repeats added where the ranking is undecided (a sequential design): after the planned rounds, each added
round trains one more repeat of the configurations whose place is still open, beside their placement's top
configuration (ratios pair runs of one round), until every configuration is placed, the study's rounds are
used up, or its budget of runs or minutes is spent (added minutes, or the whole study's run time, planned runs
included: `gpt2dist tune`'s rounds are these, within its budget). Without halving, a round repeats every configuration
of a placement that has one undecided: the control of what halving saves. Each round is a Snakemake checkpoint job
(workflow/rules/added.smk) that writes what it decided, with each configuration's gap to its placement's top; the runs
it names are ordinary train jobs.

Fixed run counts (MLPerf's) spend repeats where the answer is already clear and too few where it is not;
pyperf calibrates the count to the noise of one benchmark. Here the count follows the question the study asks:
is this configuration in the top tier or not.
"""

from __future__ import annotations

from pathlib import Path

from gpt2dist.config.schema import AddedRepeats
from gpt2dist.io import atomic_write_json
from gpt2dist.pipeline.duration import finished_runs
from gpt2dist.pipeline.layout import added_round_file
from gpt2dist.pipeline.study import run_of, Study
from gpt2dist.results.collect import collect
from gpt2dist.inputs import read_json

OPEN_GAPS = {"too few repeats", "only disturbed runs"}  # no ratio to judge yet
NOISE_GAPS = {"not distinguishable", "faster"}  # a ratio whose interval includes 1


def undecided(answer: list[dict], resolve: float) -> dict[str, list[str]]:
    """Per placement, its top configuration and those whose place more runs could settle: without an undisturbed
    pair yet, or with a ratio interval that holds both 1 and a gap of `resolve` or more. A configuration certainly
    within `resolve` of the top counts as tied; one that is the top's computation (dp at one process) is not a
    rival; one the study plans to run once is left as planned."""
    found = {}
    for group in answer:
        top, *others = group["ranked"]
        open_ = [row["config_id"] for row in others if not row.get("same_as") and (
            row["gap"] in OPEN_GAPS or (row["gap"] in NOISE_GAPS and (row["vs_fastest_ci_low"] is None
                                                                      or row["vs_fastest_ci_low"] < 1 - resolve)))]
        if open_:
            found[group["placement"]] = [top["config_id"], *open_]
    return found


def plan_round(study: Study, k: int, answer: list[dict], spent: dict, minutes_per_run: dict[str, float],
               study_minutes: float = 0.0) -> dict:
    """Added round `k`: the runs it trains (a placement's top and as many of its undecided as the budget still
    allows, at least one; without halving, every configuration of a placement with one undecided) and, when it
    trains none, why the added rounds stop. `study_minutes`: what every run of the study took so far (planned and
    added), which study.added_repeats.max_study_minutes bounds."""
    budget: AddedRepeats = study.preset.study.added_repeats
    repeat = max(run.repeat for run in study.runs) + 1  # one past the last round trained, planned or added
    open_ = undecided(answer, budget.resolve)
    if not budget.halving:  # the control: every configuration of the placement again, the placed ones included
        open_ = {group["placement"]: [row["config_id"] for row in group["ranked"] if not row.get("same_as")]
                 for group in answer if group["placement"] in open_}
    runs_left = budget.max_runs - spent["runs"] if budget.max_runs else float("inf")
    minutes_left = min(budget.max_minutes - spent["minutes"] if budget.max_minutes else float("inf"),
                       budget.max_study_minutes - study_minutes if budget.max_study_minutes else float("inf"))
    chosen_all, left = [], {}
    for placement, (top, *rest) in open_.items():
        chosen = [top]
        for config in rest:
            fits = len(chosen) + 1 <= runs_left and \
                sum(minutes_per_run.get(c, 0.0) for c in [*chosen, config]) <= minutes_left
            (chosen if fits else left.setdefault(placement, [])).append(config)
        if len(chosen) > 1:  # the top alone settles nothing
            chosen_all += chosen
            runs_left -= len(chosen)
            minutes_left -= sum(minutes_per_run.get(c, 0.0) for c in chosen)
        else:
            left[placement] = rest
    study_words = f"; the study's runs took {study_minutes:.1f} of its {budget.max_study_minutes:g} minutes" \
        if budget.max_study_minutes else ""
    why = None if chosen_all else "every configuration is placed or tied" if not open_ else \
        f"the budget is spent ({spent['runs']} runs, {spent['minutes']:.1f} minutes added{study_words})"
    return {"round": k, "repeat": repeat, "budget": budget.model_dump(),
            "runs": [f"{config}-r{repeat}" for config in chosen_all],
            "undecided": undecided(answer, budget.resolve), "left_out": left, "stopped": why,
            "gaps": {group["placement"]: {row["config_id"]: row["gap"] for row in group["ranked"]}
                     for group in answer},
            "study_minutes": study_minutes,
            "spent": {"runs": spent["runs"] + len(chosen_all),
                      "minutes": spent["minutes"] + sum(minutes_per_run.get(c, 0.0) for c in chosen_all)}}


def decide_round(study: Study, k: int, runs_dir: Path, data_dir: Path, results: Path, scratch: Path) -> dict:
    """Collect the runs so far (planned and added) into `scratch`, rank them, and write added round `k`'s plan
    into results/rounds/."""
    summary = collect(study, runs_dir, data_dir, scratch)
    seconds = finished_runs(study, runs_dir)
    per_config: dict[str, list[float]] = {}
    for run_id, value in seconds.items():
        per_config.setdefault(run_of(study, run_id).config_id, []).append(value / 60)
    minutes = {config: sum(values) / len(values) for config, values in per_config.items()}
    previous = spent_so_far(results, k)
    plan = plan_round(study, k, summary["answer"], previous, minutes, sum(seconds.values()) / 60)
    atomic_write_json(added_round_file(k, results), plan)
    return plan


def spent_so_far(results: Path, k: int) -> dict:
    """What the added rounds before `k` spent, from the last one's plan."""
    if k == 1:
        return {"runs": 0, "minutes": 0.0}
    return read_json(Path(added_round_file(k - 1, results)), "gpt2dist add-round")["spent"]
