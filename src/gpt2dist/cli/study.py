"""Commands of a study: gather its runs (collect, add-round), draw and word it (plot, report), pack and rebuild it
(bundle, figures), and its duration (estimate, progress)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from gpt2dist.cli.common import (COUNT, DEFAULT_PARAMS, WARNING_CONTINUED, Gpus, Nodes, Params, PresetName, RunsDir,
                                 app, one_line_errors, planned_study, say)
from gpt2dist.errors import UsageError
from gpt2dist.pipeline.layout import DATA_DIR, ESTIMATE_FILE, RESULTS_DIR, RUNS_DIR, STORED_STUDIES


@app.command()
@one_line_errors
def collect(
    runs: RunsDir = Path(RUNS_DIR),
    data: Annotated[Path, typer.Option(help="Token shard directory the runs trained on.")] = Path(DATA_DIR),
    out: Annotated[Path, typer.Option(help="Where metrics.csv, runs.csv, summary.csv and summary.json go.")] =
    Path(RESULTS_DIR),
    params: Params = DEFAULT_PARAMS,
    preset: PresetName = None,
    gpus: Gpus = None,
    nodes: Nodes = None,
    mixed_hardware: Annotated[bool, typer.Option(help="Compare runs made on different hardware (GPU or CPU model, "
                                                      "NVLink or PCIe) instead of refusing; the summary names them.")] = False,
) -> None:
    """Gather every run of the study (with the repeats its added rounds decided) into one tidy table and a
    per-configuration summary."""
    from gpt2dist.pipeline.study import with_added_runs
    from gpt2dist.results.collect import collect as run_collect

    study = with_added_runs(planned_study(params, preset, gpus, nodes), out)
    result = run_collect(study, runs, data, out, mixed_hardware=mixed_hardware)
    typer.echo(f"ok: {len(result['configs'])} configurations of preset {result['preset']} summarised in {out}")


@app.command("add-round")
@one_line_errors
def add_round(
    round_: Annotated[int, typer.Option("--round", help="Which added round to decide (1 for the first).",
                                        callback=COUNT.callback)],
    runs: RunsDir = Path(RUNS_DIR),
    data: Annotated[Path, typer.Option(help="Token shard directory the runs trained on.")] = Path(DATA_DIR),
    results: Annotated[Path, typer.Option(help="The study's results directory (rounds/ is written there).")] =
    Path(RESULTS_DIR),
    params: Params = DEFAULT_PARAMS,
    preset: PresetName = None,
    gpus: Gpus = None,
    nodes: Nodes = None,
) -> None:
    """Decide an added round: rank the runs so far and name the repeats that configurations still undecided (and
    their placement's top) train next, within study.added_repeats' budget; the pipeline runs it after the
    planned rounds."""
    import tempfile

    from gpt2dist.pipeline.study import with_added_runs
    from gpt2dist.results.added_repeats import decide_round

    study = planned_study(params, preset, gpus, nodes)
    if round_ > study.preset.study.added_repeats.rounds:
        raise UsageError(f"--round {round_}: preset '{study.preset_name}' adds at most "
                         f"{study.preset.study.added_repeats.rounds} rounds (study.added_repeats.rounds)")
    study = with_added_runs(study, results, upto=round_ - 1)
    with tempfile.TemporaryDirectory(prefix="gpt2dist-round-") as scratch:
        plan = decide_round(study, round_, runs, data, results, Path(scratch))
    typer.echo(f"ok: added round {round_}: " + (f"{len(plan['runs'])} runs ({', '.join(plan['runs'])})"
                                                if plan["runs"] else f"no runs: {plan['stopped']}"))


@app.command()
@one_line_errors
def plot(
    results: Annotated[Path, typer.Option(help="Directory written by `gpt2dist collect`.")] = Path(RESULTS_DIR),
) -> None:
    """Draw the study's figures (PNG and SVG) from the collected tables."""
    from gpt2dist.inputs import read_summary

    read_summary(results)  # a missing or foreign summary is told before matplotlib loads
    from gpt2dist.results.plots import plot as run_plot

    typer.echo(f"ok: {len(run_plot(results))} figure files in {results / 'figures'}")


@app.command()
@one_line_errors
def report(
    results: Annotated[Path, typer.Option(help="Directory written by `gpt2dist collect`.")] = Path(RESULTS_DIR),
    against: Annotated[Optional[list[Path]], typer.Option(
        help="Other stored studies to set each claim's verdict beside: a study's results directory, or a directory "
             f"of them; those of another preset are skipped. Repeatable [default: {STORED_STUDIES}, where it "
             "exists].")] = None,
) -> None:
    """Write results/summary.md and findings.md: the answer, the comparison table, the claims and the environment."""
    from gpt2dist.inputs import read_summary

    read_summary(results)  # a missing or foreign summary is told before pandas and scipy load
    for place in against or []:
        if place.is_file():
            raise UsageError(f"--against {place} is a file: give a study's results directory (one with summary.json), "
                             f"or a directory of them such as {STORED_STUDIES}")
        if not place.exists():  # named on the command line: a mistyped path, not a comparison with nothing
            raise UsageError(f"--against {place}: no such directory; name a study's results directory or a directory "
                             f"of them (such as {STORED_STUDIES}), or leave --against out")
    if against is None:
        stored = Path(STORED_STUDIES)
        if not stored.is_dir():  # the default, which a copy of the workflow may lack: a warning, the report goes on
            say(f"warning: {stored}: no such directory, so no stored study to compare with", err=True,
                indent=WARNING_CONTINUED)
        against = [stored] if stored.is_dir() else []
    from gpt2dist.results.report import report as run_report

    typer.echo(f"ok: {run_report(results, against)}")


@app.command()
@one_line_errors
def bundle(
    out: Annotated[Path, typer.Option(help="Archive to write (.tar.gz).")],
    runs: RunsDir = Path(RUNS_DIR),
    data: Annotated[Path, typer.Option(help="Token shard directory the runs trained on.")] = Path(DATA_DIR),
    params: Params = DEFAULT_PARAMS,
    preset: PresetName = None,
    gpus: Gpus = None,
    nodes: Nodes = None,
    results: Annotated[Path, typer.Option(help="The study's results directory: the repeats its added rounds decided "
                                          "(rounds/) and a tune's plan (tune.json) are packed from it.")] =
    Path(RESULTS_DIR),
    checkpoints: Annotated[bool, typer.Option(help="Add the final checkpoints the runs kept (study.keep_checkpoints), "
                                              "for `gpt2dist export` elsewhere; a rebuild does not need them.")
                           ] = False,
) -> None:
    """Pack the study's run records (its added rounds' too), shard description and parameters into one verifiable
    archive."""
    from gpt2dist.pipeline.study import with_added_runs
    from gpt2dist.results.bundle import write_bundle

    study = with_added_runs(planned_study(params, preset, gpus, nodes), results)
    description = write_bundle(study, runs, data, params, out, results, checkpoints=checkpoints)
    missing = f", {len(description['missing_runs'])} missing (listed in its bundle.json)" if description[
        "missing_runs"] else ""
    typer.echo(f"ok: {out}: {len(description['runs'])} runs of preset {description['preset']}{missing}")


@app.command()
@one_line_errors
def figures(
    source: Annotated[Path, typer.Option("--from", help="Bundle written by `gpt2dist bundle`.")],
    out: Annotated[Path, typer.Option(help="Directory for the tables, figures, summary.md and findings.md.")] = Path(
        "results/from-bundle"),
) -> None:
    """Verify a bundle and rebuild every table, figure and finding from it, without training."""
    from gpt2dist.results.bundle import rebuild

    summary = rebuild(source, out)
    typer.echo(f"ok: {len(summary['configs'])} configurations of preset {summary['preset']} rebuilt in {out}")


@app.command()
@one_line_errors
def estimate(
    params: Params = DEFAULT_PARAMS,
    preset: PresetName = None,
    gpus: Gpus = None,
    nodes: Nodes = None,
    runs: RunsDir = Path(RUNS_DIR),
    out: Annotated[Path, typer.Option(help="JSON file with the expected seconds of every job.")] = Path(ESTIMATE_FILE),
) -> None:
    """Time a few steps of the preset's model here and print how long the rest of the study will take; on a GPU,
    also single's step at two micro-batches, which calibrates the GPU step model for plan and recommend
    (--calibration)."""
    from gpt2dist.pipeline.duration import estimate_line, finished_runs, write_estimate
    from gpt2dist.pipeline.layout import selftest_file
    from gpt2dist.pipeline.study import configurations, study_precisions
    from gpt2dist.selftest import CALIBRATION_STEPS, calibrate
    from gpt2dist.system.conditions import run_cpus
    from gpt2dist.system.hardware import visible_gpus

    study = planned_study(params, preset, gpus, nodes)
    finished = finished_runs(study, runs)
    if len(finished) == len(study.runs):
        typer.echo(f"estimate: all {len(study.runs)} runs of preset '{study.preset_name}' are done; nothing to time")
        return
    if study.device == "cuda" and not visible_gpus():
        typer.echo(f"estimate: none made here: preset '{study.preset_name}' trains on GPUs and this host has none "
                   "(a cluster's login node); each finished run prints how many are done")
        return
    typer.echo(f"estimate: timing {CALIBRATION_STEPS} steps of preset '{study.preset_name}''s model in "
               f"{' and '.join(study_precisions(study))}, one process...")
    checked = {run.config_id for run in configurations(study) if Path(selftest_file(run)).exists()}
    measured = calibrate(study)
    calibration = _gpu_calibration(study, out, measured.step_s) if study.device == "cuda" else {}
    typer.echo(estimate_line(write_estimate(study, measured, len(run_cpus()), out, calibration), finished, checked))


def _gpu_calibration(study, out: Path, preset_steps: dict[str, float]) -> dict:
    """Single's step on this GPU at two micro-batches (half the preset's and the preset's, one pass a step), in each
    precision of the study, with the preset's own step timed just before (`preset_steps`), beside the GPU step
    model's predictions: what plan and recommend --calibration correct its computation by. Said a precision a line,
    with the model's error on published runs."""
    from dataclasses import asdict

    from gpt2dist.forecast.gpu_step import peak_of
    from gpt2dist.forecast.plan import CALIBRATION_KEY, calibrate_gpu
    from gpt2dist.forecast.published import shipped_fit
    from gpt2dist.pipeline.study import study_precisions
    from gpt2dist.selftest import micro_batch_steps
    from gpt2dist.system.hardware import GPUS, command_output, named_in

    name = (command_output(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"]) or "").splitlines()[:1]
    if not name or named_in(name[0], GPUS) is None:
        typer.echo(f"estimate: the GPU step model has no datasheet for {name[0] if name else 'this GPU'}; nothing "
                   "calibrated")
        return {}
    rows = study.preset.train.micro_batch_size
    micro_batches = (max(1, rows // 2), rows) if rows > 1 else (1, 2)
    calibrations = {}
    for precision in study_precisions(study):
        try:
            peak_of(name[0], precision)
        except UsageError:
            continue  # a precision this GPU has no arithmetic for: the study cannot run it here either
        typer.echo(f"estimate: timing single's step at {micro_batches[0]} and {micro_batches[1]} sequences in "
                   f"{precision} on this {name[0]}...")
        timed = calibrate_gpu(study.preset_name, study.preset, name[0], precision,
                              micro_batch_steps(study, precision, micro_batches), preset_steps.get(precision))
        calibrations[precision] = asdict(timed)
        typer.echo(f"estimate: single's step {timed.timings_words()}; the GPU step model is off by "
                   f"{shipped_fit()['throughput_median_abs_error']:.0%} on published runs out of source (median): its "
                   f"computation here is {timed.scale:.3g}x {timed.offset_s * 1e3:+.3g} ms a step, which plan and "
                   f"recommend --calibration {out} apply")
    return {CALIBRATION_KEY: calibrations} if calibrations else {}


@app.command()
@one_line_errors
def progress(
    params: Params = DEFAULT_PARAMS,
    preset: PresetName = None,
    gpus: Gpus = None,
    nodes: Nodes = None,
    runs: RunsDir = Path(RUNS_DIR),
    estimate: Annotated[Path, typer.Option(help="Written by `gpt2dist estimate`.")] = Path(ESTIMATE_FILE),
) -> None:
    """Print how many runs of the study are done (those its added rounds decided so far included) and about how long
    the rest takes."""
    from gpt2dist.pipeline.duration import finished_runs, progress_line
    from gpt2dist.pipeline.study import with_added_runs
    from gpt2dist.inputs import read_json

    study = with_added_runs(planned_study(params, preset, gpus, nodes))
    planned = read_json(estimate, "gpt2dist estimate") if estimate.exists() else None
    typer.echo(progress_line(study, finished_runs(study, runs), planned))
