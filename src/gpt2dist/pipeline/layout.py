"""Where a study's files live, relative to the directory it runs in: what the Snakefile, dvc.yaml, the commands
and the tests all name."""

from __future__ import annotations

from pathlib import Path

from gpt2dist.pipeline.run import Run

PARAMS_FILE = "params.yaml"  # the one parameter file, in the directory a study runs in
DATA_DIR = "data/tokens"
RUNS_DIR = "results/runs"
RESULTS_DIR = "results"
SELFTEST_DIR = f"{RESULTS_DIR}/selftest"  # the pipeline's selftests, one file per configuration (selftest_file)
SELFTEST_REPORT = f"{RESULTS_DIR}/selftest.json"  # `gpt2dist selftest` run by hand: every configuration's checks
STORED_STUDIES = "docs/reference"  # the studies the repository keeps, each in a directory of its own
TRACES_DIR = "traces"  # in a results directory: each configuration's kept traces, one file per rank (collect)
ESTIMATE_FILE = f"{RESULTS_DIR}/estimate.json"  # the study's expected duration, run by run (pipeline/duration.py)
FIGURES = ("throughput", "scaling", "loss_deviation", "loss_vs_time", "memory", "time_ledger")
# In a run's directory: TensorBoard's event file of its metrics (training.tensorboard_events; TensorBoard finds it by
# "tfevents"), and what the run keeps once it has ended, in one directory that the workflow tools declare whatever it
# holds: each rank's trace of the last traced step (none where the run resumed past its traced steps, or traced none)
# and, where the study keeps it (study.keep_checkpoints), the final checkpoint. Never checkpoint.pt itself, what a
# re-run resumes from: the tools delete a failed or interrupted job's outputs.
EVENTS = "events.out.tfevents.gpt2dist"
KEPT_DIR = "kept"
LINK_FIGURE = "links"  # drawn for studies with runs on emulated nodes' shaped links
# gpt2dist tune: a study of its own in TUNE_DIR (its params.yaml, data/, results/, logs/), its answer and calibration
# at the top; in a results directory (its study's, or a rebuild's) its plan, and there its answer as TUNE_ANSWER
TUNE_DIR = f"{RESULTS_DIR}/tune"
TUNE_PLAN = "tune.json"
TUNE_ANSWER = "tune.md"
TUNE_SUMMARY = "summary.md"
TUNE_CALIBRATION = "calibration.json"
TUNE_MEASURED = "measured.csv"  # a GPU tune's measured splits as rows of the table the GPU step model is judged on
SLURM_PROFILE = "workflow/profiles/slurm"  # the Snakemake profile that sends a study's or a tune's jobs to SLURM


def round_marker(repeat: int | str) -> str:
    """The Snakefile's order-only file for a finished repeat round (DVC keeps the order by stage order)."""
    return f"{RESULTS_DIR}/rounds/r{repeat}.done"


def added_round_file(k: int | str, results: Path | str = RESULTS_DIR) -> str:
    """What added round `k` decided (results/added_repeats.py writes it; the Snakefile reads it)."""
    return f"{results}/rounds/added-{k}.json"


def retry_marker(run_id: str) -> str:
    """Made by the Snakefile for a run whose record says it did not complete: an input newer than the run's
    outputs, so Snakemake trains it again (resuming from its checkpoint where it has one)."""
    return f"{RUNS_DIR}/{run_id}/retry"


def run_outputs(run_id: str) -> dict[str, str]:
    """The files of a run that its train job declares (`run_id` may be a workflow tool's placeholder for one): its
    record, metrics, the spec it ran, TensorBoard's event file, and kept/ (a directory)."""
    run = f"{RUNS_DIR}/{run_id}"
    return {"record": f"{run}/run.json", "metrics": f"{run}/metrics.jsonl", "spec": f"{run}/spec.json",
            "events": f"{run}/{EVENTS}", "kept": f"{run}/{KEPT_DIR}"}


def selftest_file(run: Run) -> str:
    return f"{SELFTEST_DIR}/{run.config_id}.json"


def headline_file(run: Run) -> str:
    """A configuration's three headline numbers (results.compact): one `dvc metrics show` row."""
    return f"{RESULTS_DIR}/headline/{run.config_id}.json"
