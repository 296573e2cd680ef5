"""Commands that predict before anything runs: the plan of a study, a recommendation for a GPU cluster, the link model's
projection, and the planner held to published GPU measurements."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Optional

import typer

from gpt2dist.cli.common import (COUNT, DEFAULT_PARAMS, POSITIVE, AssumedMfu, Calibration, GpuMemory, GpuModel, Gpus,
                                 LinkAcross, LinkInside, ModelSizes, Nics, Nodes, Params, PresetName, app, cuda_visible,
                                 numbers, one_line_errors, planned_study, say)
from gpt2dist.errors import UsageError
from gpt2dist.system.hardware import FORECAST_GPU, gpu_memory_gb


def _model_sizes(text: str | None) -> list[str]:
    """--sizes' GPT-2 sizes, in the order given."""
    from gpt2dist.config.sizes import GPT2_SIZES

    if text is None:
        return []
    chosen = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [part for part in chosen if part not in GPT2_SIZES]
    if not chosen or unknown:
        raise UsageError(f"--sizes {text!r}: name GPT-2 sizes from {', '.join(GPT2_SIZES)}, e.g. --sizes "
                         "small,medium,large,xl")
    return list(dict.fromkeys(chosen))


def calibrated(path: Path | None, gpu: str, mfu: float | None) -> dict | None:
    """--calibration's GPU calibrations by precision, none without it; it corrects the GPU step model, which --mfu
    replaces."""
    from gpt2dist.forecast.plan import read_calibration
    from gpt2dist.forecast.tuned import is_tuned

    if path is None:
        return None
    if is_tuned(path):
        raise UsageError(f"--calibration {path} is a tune's: recommend reads it (each split corrected by what the tune "
                         "measured); plan and project-scaling take the one `gpt2dist estimate` writes")
    if mfu is not None:
        raise UsageError("--calibration corrects the GPU step model's computation, which --mfu replaces; leave one out")
    return read_calibration(path, gpu)


@app.command()
@one_line_errors
def plan(
    params: Params = DEFAULT_PARAMS,
    preset: PresetName = None,
    gpus: Gpus = None,
    nodes: Nodes = None,
    gpu: GpuModel = None,
    mfu: AssumedMfu = None,
    calibration: Calibration = None,
    link_inside: LinkInside = None,
    link_across: LinkAcross = None,
    nics: Nics = None,
    memory_gb: Annotated[Optional[str], typer.Option(help="GPU memory sizes to check the fit against, in GB "
                                                     "[default: those the --gpu ships with, e.g. 80,40 for the "
                                                     "A100].")] = None,
    out: Annotated[Optional[Path], typer.Option(help="Also write the plan as CSV here.")] = None,
    output_format: Annotated[str, typer.Option("--format", help="table (for a terminal, 100 columns), or csv or "
                                               "json: the whole table, every column, nothing else.")] = "table",
    model_sizes: Annotated[Optional[str], typer.Option("--sizes", help="GPT-2 sizes to plan the study's "
                                                       "configurations at instead of their own, e.g. "
                                                       "small,medium,large,xl.")] = None,
    budget_s: Annotated[Optional[float], typer.Option("--budget-s", help="Fail (one error line, status 2) when the "
                                                      "study on GPUs is predicted to take longer than this many "
                                                      "seconds: a job's or a lease's time limit.")] = None,
) -> None:
    """Before running: each configuration's predicted memory per rank and step time, the study's duration, and
    what will not fit a GPU's memory (at GPT-2's larger sizes too, with --sizes)."""
    from gpt2dist.io import atomic_open
    from gpt2dist.forecast.plan import plan as plan_table
    from gpt2dist.forecast.plan import study_seconds
    from gpt2dist.forecast.words import plan_report
    from gpt2dist.system.links import links_of

    if output_format not in ("table", "csv", "json"):
        raise UsageError(f"--format {output_format!r}: choose table, csv or json")
    sizes = numbers(memory_gb, "--memory-gb", POSITIVE, "80,40") if memory_gb is not None else None
    models = _model_sizes(model_sizes)
    study = planned_study(params, preset, gpus, nodes)
    if study.device != "cuda" and (gpu, mfu, calibration, link_inside, link_across, nics) != (None,) * 6:
        raise UsageError(f"--gpu, --mfu, --calibration and the links set a GPU's step time, and preset "
                         f"'{study.preset_name}' is planned here for CPUs; leave them out, or plan for GPUs with --gpus N")
    if budget_s is not None and not 0 < budget_s < math.inf:
        raise UsageError(f"--budget-s {budget_s:g}: give the seconds the study may take, above 0 (e.g. 540)")
    if budget_s is not None and (study.device != "cuda" or models):
        raise UsageError("--budget-s checks a study planned on GPUs at its own sizes: add --gpus N, and leave out "
                         "--sizes")
    gpu = gpu or FORECAST_GPU
    sizes = sizes or list(gpu_memory_gb(gpu))
    links = links_of(gpu, link_inside, link_across, nics)
    timed = calibrated(calibration, gpu, mfu)
    table = plan_table(study, gpu=gpu, mfu=mfu, memory_gb=sizes, links=links, sizes=models, calibration=timed)
    duration = study_seconds(study, table) if study.device == "cuda" and not models else None
    if budget_s is not None and duration["total"] > budget_s:
        raise UsageError(f"preset '{study.preset_name}' is predicted to take {duration['total']:,.0f} s on "
                         f"{study.gpus} {gpu} GPU(s), over --budget-s {budget_s:g}: cut its runs (study.runs, "
                         "study.repeats, study.selftests) or steps (train.max_steps), or give it more time")
    if out:
        with atomic_open(out, "w") as handle:
            table.to_csv(handle, index=False)
    if output_format != "table":
        typer.echo(table.to_csv(index=False) if output_format == "csv" else table.to_json(orient="records", indent=1))
        return

    for kind, text in plan_report(study, table, gpu=gpu, mfu=mfu, memory_gb=sizes, links=links, duration=duration,
                                  budget_s=budget_s, calibration=timed):
        say(text) if kind == "prose" else typer.echo(text)
    if out:
        typer.echo(f"ok: {out}")


@app.command()
@one_line_errors
def recommend(
    gpus: Annotated[Optional[int], typer.Option(help="GPUs per node of the cluster [default: the tuned cluster's, "
                                                "with --calibration from gpt2dist tune].",
                                                callback=COUNT.callback)] = None,
    nodes: Annotated[Optional[int], typer.Option(help="Nodes of the cluster [default: 1, or the tuned cluster's].",
                                                 callback=COUNT.callback)] = None,
    gpu: GpuModel = None,
    memory_gb: GpuMemory = None,
    params: Params = DEFAULT_PARAMS,
    preset: Annotated[Optional[str], typer.Option(help="Preset whose model and micro-batch to train [default: paper, "
                                                  "or the tuned one].")] = None,
    precision: Annotated[Optional[str], typer.Option(help="Arithmetic of the runs [default: bf16, or the tuned "
                                                     "one].")] = None,
    tokens: Annotated[float, typer.Option(help="Tokens to train.", callback=POSITIVE.callback)] = 1e10,
    mfu: AssumedMfu = None,
    calibration: Annotated[Optional[Path], typer.Option(
        help="estimate.json that `gpt2dist estimate` wrote on a GPU node of this cluster (the GPU step model's "
             "computation corrected by single's steps timed there), or calibration.json that `gpt2dist tune` wrote "
             "(each split corrected by what the tune measured; on CPUs the tuned machine's own prediction) "
             "[default: none].")] = None,
    link_inside: LinkInside = None,
    link_across: LinkAcross = None,
    nics: Nics = None,
    model_sizes: ModelSizes = None,
    studies: Annotated[Optional[list[Path]], typer.Option(
        "--study", help="A collected study (results directory) whose runs measure the model's error; repeatable. "
        "Default: the reference studies under docs/reference.")] = None,
) -> None:
    """Rank the strategies for a GPU cluster by predicted hours to train --tokens, with memory fit, an interval
    from the step-time model's leave-one-out error on stored studies, and what it extrapolates beyond; with a tune's
    calibration, corrected by what it measured (on CPUs: the tuned machine's splits by the CPU step model)."""
    from gpt2dist.config.presets import load_params
    from gpt2dist.pipeline.study import preset_sizes
    from gpt2dist.forecast.words import recommend_report, tuned_cpu_report
    from gpt2dist.forecast.recommend import read_stored
    from gpt2dist.forecast.tuned import is_tuned, read_tuned
    from gpt2dist.system.links import links_of

    tuned = read_tuned(calibration) if calibration is not None and is_tuned(calibration) else None
    if tuned is not None and tuned.cluster.device == "cpu":
        if (gpus, nodes, gpu, memory_gb, mfu, link_inside, link_across, nics) != (None,) * 8:
            raise UsageError(f"--calibration {calibration} is a tune on CPUs: recommend then predicts the machine it "
                             "ran on; leave out the GPU cluster's options (--gpus, --nodes, --gpu, the links, --mfu)")
        if precision not in (None, tuned.precision):
            raise UsageError(f"--precision {precision}: the tune measured {tuned.precision}; leave --precision out")
        name, chosen = load_params(params).preset(preset or tuned.preset)
        for kind, text in tuned_cpu_report(tuned, name, chosen, _model_sizes(model_sizes) or [tuned.size]):
            say(text) if kind == "prose" else typer.echo(text)
        return
    if tuned is not None and gpus is None:
        gpus, nodes, gpu = tuned.cluster.gpus_per_node, nodes or tuned.cluster.nodes, gpu or tuned.cluster.gpu
    if gpus is None:
        raise UsageError("--gpus: say how many GPUs a node of the cluster has (or give --calibration from a tune, "
                         "which names its cluster)")
    nodes = nodes or 1
    directories = studies or sorted(p.parent / p.name.removesuffix(".tar.gz")
                                    for p in (params.parent / "docs" / "reference").glob("*.tar.gz"))
    if not directories:
        raise UsageError("no stored study to measure the model's error on: pass --study <results directory>")
    stored = read_stored(directories)
    name, chosen = load_params(params).preset(preset or (tuned.preset if tuned else "paper"), cuda=True)
    gpu = gpu or FORECAST_GPU
    if tuned is not None:
        tuned_gpu(tuned, gpu, mfu, calibration)
    memory_gb = memory_gb or max(gpu_memory_gb(gpu))
    links = links_of(gpu, link_inside, link_across, nics)
    sizes = _model_sizes(model_sizes) or preset_sizes(chosen)
    precision = precision or (tuned.precision if tuned else "bf16")
    for kind, text in recommend_report(name, chosen, stored, sizes, gpu=gpu, gpus=gpus, nodes=nodes,
                                       precision=precision, mfu=mfu, tokens=tokens, memory_gb=memory_gb, links=links,
                                       params=params, calibration=None if tuned else calibrated(calibration, gpu, mfu),
                                       tuned=tuned):
        say(text) if kind == "prose" else typer.echo(text)


def tuned_gpu(tuned, gpu: str, mfu: float | None, path: Path) -> None:
    """A GPU tune's calibration holds for its GPU model and the GPU step model: refused in one line for another."""
    from gpt2dist.system.hardware import GPUS, named_in

    if mfu is not None:
        raise UsageError("--calibration from a tune corrects the GPU step model's prediction, which --mfu replaces; "
                         "leave one out")
    if named_in(tuned.cluster.gpu, GPUS) != named_in(gpu, GPUS):
        raise UsageError(f"--calibration {path} was measured on {tuned.cluster.gpu} GPUs, and this recommendation is "
                         f"for a {gpu}: give --gpu {named_in(tuned.cluster.gpu, GPUS)}, or tune on a {gpu}")


@app.command("project-scaling")
@one_line_errors
def project_scaling(
    params: Params = DEFAULT_PARAMS,
    preset: PresetName = None,
    gpu: GpuModel = None,
    precision: Annotated[str, typer.Option(help="Arithmetic of the projected runs.")] = "bf16",
    mfu: AssumedMfu = None,
    calibration: Calibration = None,
    gpus_per_node: Annotated[int, typer.Option(help="GPUs per node.", callback=COUNT.callback)] = 8,
    nodes: Annotated[str, typer.Option(help="Node counts, e.g. 1,2,4,8.")] = "1,2,4,8",
    link_inside: LinkInside = None,
    link_across: LinkAcross = None,
    nics: Nics = None,
    model_sizes: ModelSizes = None,
    strategies: Annotated[Optional[str], typer.Option(help="Strategies or splits to project, e.g. "
                                                      "ddp,fsdp,ddp-tp2,ddp-tp2-pp2 [default: the data-parallel "
                                                      "strategies].")] = None,
) -> None:
    """Project a preset's strategies (the data-parallel ones, or any splits named) to GPU clusters (a projection,
    not a measurement: the GPU step model, each group's collectives on its own link)."""
    from gpt2dist.config.presets import load_params
    from gpt2dist.pipeline.study import preset_sizes
    from gpt2dist.forecast.words import projection_report
    from gpt2dist.system.links import links_of

    counts = numbers(nodes, "--nodes", COUNT, "1,2,4,8")
    name, chosen = load_params(params).preset(preset, cuda=cuda_visible())
    gpu = gpu or FORECAST_GPU
    links = links_of(gpu, link_inside, link_across, nics)
    sizes = _model_sizes(model_sizes) or preset_sizes(chosen)
    named = tuple(dict.fromkeys(part.strip() for part in strategies.split(",") if part.strip())) if strategies \
        else None
    if strategies is not None and not named:
        raise UsageError(f"--strategies {strategies!r}: name strategies or splits, e.g. --strategies ddp,ddp-tp2")
    for kind, text in projection_report(name, chosen, sizes, counts, gpu=gpu, precision=precision, mfu=mfu,
                                        gpus_per_node=gpus_per_node, links=links, strategies=named,
                                        calibration=calibrated(calibration, gpu, mfu)):
        say(text) if kind == "prose" else typer.echo(text)


def _held(item: str) -> tuple[str, float]:
    """--hold's NAME=VALUE."""
    name, _, value = item.partition("=")
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if not math.isfinite(number):
        raise UsageError(f"--hold {item!r}: give NAME=VALUE with a number, e.g. --hold kernel_s=1e-6")
    return name.strip(), number


@app.command("validate-published")
@one_line_errors
def validate_published(
    mfu: AssumedMfu = None,
    table: Annotated[Optional[Path], typer.Option(help="A table of measurements in published_gpt2.csv's columns "
                                                   "[default: the one gpt2dist ships].")] = None,
    add: Annotated[Optional[list[Path]], typer.Option(help="More rows in the same columns, held with the table's, e.g. "
                                                      "the measured.csv a tune on GPUs writes (its rows predicted "
                                                      "without their own source, as every other); repeatable.")] = None,
    output_format: Annotated[str, typer.Option("--format", help="table (for a terminal), or csv or json: every row "
                                               "with its prediction, nothing else.")] = "table",
    hold: Annotated[Optional[list[str]], typer.Option(help="Keep a constant of the GPU step model at a value instead "
                                                      "of fitting it, NAME=VALUE (e.g. kernel_s=1e-6): what it changes "
                                                      "out of source; repeatable.")] = None,
    write_fit: Annotated[Optional[Path], typer.Option(help="Also write the constants fitted to every row and the "
                                                      "out-of-source error here, as plan and recommend read them "
                                                      "(gpt2dist ships src/gpt2dist/forecast/gpu_fit.json, written "
                                                      "this way).")] = None,
) -> None:
    """Hold the planner to GPT-2 training that others measured on GPUs and published: each row's throughput and
    memory predicted out of source (the GPU step model's constants fitted to every other source) beside the published
    ones, and within each source's machine whether the planner orders every two rows as they were measured."""
    from gpt2dist.forecast.words import validation_report
    from gpt2dist.forecast.published import TABLE, check_held, read_tables, validation, write_fit as write

    if output_format not in ("table", "csv", "json"):
        raise UsageError(f"--format {output_format!r}: choose table, csv or json")
    if (write_fit or hold) and mfu is not None:
        raise UsageError(f"{'--write-fit' if write_fit else '--hold'} concerns the GPU step model's constants, which "
                         "--mfu replaces; leave one out")
    if write_fit and hold:
        raise UsageError("--write-fit writes the constants plan and recommend use, all fitted; leave out --hold")
    held = dict(_held(item) for item in hold or [])
    check_held(held)
    added = add or []
    measurements = read_tables(table or TABLE, added)
    predicted, ordered, searched, summary = validation(measurements, mfu, held)
    if write_fit:
        write(write_fit, summary)
    if output_format != "table":
        typer.echo(predicted.to_csv(index=False) if output_format == "csv" else predicted.to_json(orient="records",
                                                                                                  indent=1))
        return
    for kind, text in validation_report(predicted, ordered, searched, summary, mfu, table, added):
        say(text) if kind == "prose" else typer.echo(text)
    if write_fit:
        typer.echo(f"ok: {write_fit}")
