"""How long a study takes: an estimate before its first job, from a few timed steps of the preset's
own model (selftest.calibrate), and the time left while it runs.

Rough by design: one process's step time stands for every strategy and process count. The time left
corrects for that as the study goes, by scaling what is left of the estimate by how long the finished
runs took against their own estimates.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path

from gpt2dist.config.sizes import flops_per_token
from gpt2dist.io import atomic_write_json, cannot_be_read
from gpt2dist.pipeline.layout import ESTIMATE_FILE, RUNS_DIR
from gpt2dist.pipeline.run import Run
from gpt2dist.pipeline.study import pipeline_resume_cases, selftested, Study


@dataclass(frozen=True)
class Calibration:
    """Measured on this machine with the preset's model in one process."""

    step_s: dict[str, float]  # precision -> seconds of one optimizer step
    launch_s: float  # a run's cost besides its steps: the interpreter and imports, starting the ranks, building
    # the model, evaluating, writing


def launch_seconds(study: Study, calibration: Calibration, processes: int) -> float:
    """Starting a run: on CPUs its ranks import and build on the cores one process had to itself."""
    return calibration.launch_s * (processes if study.device == "cpu" else 1)


def run_seconds(study: Study, calibration: Calibration, run: Run) -> float:
    """A run's launch and steps; a step of another model size than the one timed takes as much longer as its
    FLOPs per token are more."""
    larger = flops_per_token(study.model(run.size)) / flops_per_token(study.preset.model)
    steps = study.preset.train.max_steps * calibration.step_s[run.precision] * larger
    return launch_seconds(study, calibration, study.processes(run)) + steps


def selftest_seconds(study: Study, calibration: Calibration, cores: int) -> dict[str, float]:
    """Configuration -> its selftest's share of the study's time. A check trains a tiny model for a few steps,
    so it costs about a launch; a resumed one launches twice more. On CPUs, checks of fewer processes than
    cores run side by side (rules/selftest.smk); on GPUs they queue."""
    resumed = {run.config_id for run in pipeline_resume_cases(study)}
    return {run.config_id: (1 + 2 * (run.config_id in resumed)) * launch_seconds(study, calibration, study.processes(run))
            / (max(1, cores // study.processes(run)) if study.device == "cpu" else 1)
            for run in selftested(study)}


def write_estimate(study: Study, calibration: Calibration, cores: int, out: Path | str = ESTIMATE_FILE,
                   extra: dict | None = None, seconds: dict[str, float] | None = None) -> dict:
    """The study's expected duration, job by job, for `progress` to scale as the runs finish (and what else was
    measured here: `extra`, the GPU step model's calibration on a GPU node); each run at its configuration's
    `seconds` where given (a tune's, priced candidate by candidate), else from single's step."""
    estimate = (extra or {}) | {
        "preset": study.preset_name,
        "written_at_unix_s": time.time(),
        "calibration": asdict(calibration),
        "selftests": selftest_seconds(study, calibration, cores),
        "runs": {run.run_id: seconds[run.config_id] if seconds else run_seconds(study, calibration, run)
                 for run in study.runs},
    }
    atomic_write_json(out, estimate)
    return estimate


def minutes(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 90 else f"{seconds:.0f} s"


def estimate_line(estimate: dict, finished: dict[str, float], checked: set[str]) -> str:
    """What is left of the study (runs not `finished`, selftests not `checked`) and how long it should take."""
    runs = [seconds for run_id, seconds in estimate["runs"].items() if run_id not in finished]
    selftests = [seconds for config, seconds in estimate["selftests"].items() if config not in checked]
    calibration = estimate["calibration"]
    steps = ", ".join(f"{precision} {seconds:.2g} s" for precision, seconds in calibration["step_s"].items())
    return (f"estimate: about {minutes(sum(runs) + sum(selftests))} for {len(runs)} runs and {len(selftests)} "
            f"selftests on this machine, tokenizing the data not counted (measured now in one process: a step "
            f"of the preset's model takes {steps}, "
            f"starting a run {calibration['launch_s']:.0f} s); each finished run prints the time left")


def wall_seconds(record: dict) -> float:
    """A run's time from the launcher's start (imports and rendezvous included) to the rank's last write."""
    began = record.get("launched_at") or record.get("started_at")
    try:
        return (datetime.fromisoformat(record["finished_at"]) - datetime.fromisoformat(began)).total_seconds()
    except (KeyError, TypeError, ValueError):
        return math.nan


def job_seconds(record: dict) -> float:
    """What a run costs the study: its wall time, plus its interpreter's start-up and its wait for a quiet
    machine, both before the launch that `wall_seconds` starts from."""
    conditions = record.get("conditions") or {}
    return wall_seconds(record) + conditions.get("startup_s", 0.0) + conditions.get("waited_for_quiet_s", 0.0)


def read_record(path: Path) -> dict:
    """A run's record; one that cannot be read (empty, cut short, not an object) is an error naming it and the
    fix: it is written atomically, so such a file was damaged afterwards, and counting it as unfinished would
    estimate a study that is not this one."""
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        record = exc
    if not isinstance(record, dict):
        raise cannot_be_read(path, record if isinstance(record, Exception) else "not a JSON object",
                             f"delete its run directory {path.parent} so that the study trains that run again, or "
                             "train it again with `gpt2dist train`")
    return record


def finished_runs(study: Study, runs_dir: Path | str = RUNS_DIR) -> dict[str, float]:
    """Run id -> seconds (job_seconds) of every run of the study that has completed."""
    done = {}
    for run in study.runs:
        path = Path(runs_dir) / run.run_id / "run.json"
        record = read_record(path) if path.exists() else {}
        if record.get("status") == "completed" and math.isfinite(seconds := job_seconds(record)):
            done[run.run_id] = seconds
    return done


def planned_seconds(study: Study, estimate: dict) -> dict[str, float]:
    """Run id -> its estimated seconds, for every run of `study`: an added repeat (not in the estimate, which was
    made before the added rounds decided it) at its configuration's estimate; none where a run is neither."""
    estimated = estimate.get("runs", {})
    by_config = {run.config_id: estimated[run.run_id] for run in study.runs if run.run_id in estimated}
    return {run.run_id: estimated.get(run.run_id, by_config.get(run.config_id)) for run in study.runs
            if run.run_id in estimated or run.config_id in by_config}


def progress_line(study: Study, finished: dict[str, float], estimate: dict | None) -> str:
    """'study: 12 of 40 runs done; about 8 min left', the estimate scaled by the finished runs (the repeats its added
    rounds decided so far included: `study` with them); with a budget of the study's run time
    (study.added_repeats.max_study_minutes), what its added rounds may still take."""
    ours = estimate if estimate and estimate.get("preset") == study.preset_name else None
    added = sum(run.run_id not in ours.get("runs", {}) for run in study.runs) if ours else 0
    head = f"study: {len(finished)} of {len(study.runs)} runs done" + (f" ({added} added)" if added else "")
    planned = planned_seconds(study, ours) if ours else {}
    if not planned or not set(finished) <= set(planned):
        return f"{head} (no estimate of this study's duration was made here)"
    scale = sum(finished.values()) / sum(planned[run_id] for run_id in finished) if finished else 1.0
    left = scale * sum(seconds for run_id, seconds in planned.items() if run_id not in finished)
    elapsed = time.time() - estimate["written_at_unix_s"]
    line = (f"{head} after {minutes(elapsed)}; about {minutes(left)} left (the finished runs took "
            f"{scale:.2g}x their estimate)")
    budget = study.preset.study.added_repeats
    if budget.rounds and budget.max_study_minutes:
        spent = sum(finished.values()) + left
        line += (f"; added rounds may take up to {minutes(max(0.0, budget.max_study_minutes * 60 - spent))} more, "
                 f"within the study's {minutes(budget.max_study_minutes * 60)} of runs")
    return line
