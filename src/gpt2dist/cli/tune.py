"""`gpt2dist tune`: the planner's short list measured on this cluster in halving rounds within a budget."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Optional

import typer

from gpt2dist.cli.common import (COUNT, DEFAULT_PARAMS, GPU_COUNT, POSITIVE, GpuMemory, GpuModel, LinkAcross,
                                 LinkInside, Nics, Number, Params, PresetName, app, one_line_errors, say)
from gpt2dist.errors import UsageError
from gpt2dist.pipeline.layout import SLURM_PROFILE, TUNE_DIR

UNITS = {"s": 1, "m": 60, "h": 3600}


def seconds(text: str | None) -> float | None:
    """--budget's '20m', '600s', '1.5h' or plain seconds."""
    if text is None:
        return None
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*", text)
    if not match or float(match[1]) <= 0:
        raise UsageError(f"--budget {text!r}: give a time above 0 such as 20m, 600s or 1.5h")
    return float(match[1]) * UNITS[match[2] or "s"]


def names(text: str | None) -> list[str] | None:
    """--among's splits, each a name the grammar reads (refused before anything is timed)."""
    from gpt2dist.config.strategies import describe

    if text is None:
        return None
    chosen = list(dict.fromkeys(part.strip() for part in text.split(",") if part.strip()))
    if not chosen:
        raise UsageError(f"--among {text!r}: name splits, e.g. --among ddp,fsdp,ddp-pp2")
    for name in chosen:
        try:
            describe(name)
        except UsageError as exc:
            raise UsageError(f"--among {name}: {exc}") from None
    return chosen


@app.command()
@one_line_errors
def tune(
    nproc: Annotated[Optional[int], typer.Option(help="Processes in all [default: on GPUs one per GPU, on CPUs one "
                                                 "per core of this machine].", callback=COUNT.callback)] = None,
    gpus: Annotated[Optional[int], typer.Option(help="GPUs per node, 0 for CPUs [default: params.yaml's "
                                                "gpus_per_node, else those visible here].",
                                                callback=GPU_COUNT.callback)] = None,
    nodes: Annotated[int, typer.Option(help="Nodes of the cluster (a SLURM cluster's, through --profile).",
                                       callback=COUNT.callback)] = 1,
    emulate_nodes: Annotated[Optional[int], typer.Option(help="Nodes emulated on this machine (network namespaces; "
                                                         "root), CPUs only.", callback=COUNT.callback)] = None,
    link_mbit: Annotated[Optional[float], typer.Option(help="With --emulate-nodes: each node's link, Mbit/s each way.",
                                                       callback=POSITIVE.callback)] = None,
    gpu: GpuModel = None,
    memory_gb: GpuMemory = None,
    link_inside: LinkInside = None,
    link_across: LinkAcross = None,
    nics: Nics = None,
    params: Params = DEFAULT_PARAMS,
    preset: PresetName = None,
    size: Annotated[Optional[str], typer.Option(help="The preset's model at this size (GPT-2's small, medium, large or "
                                                "xl, or one of its study.model_sizes).")] = None,
    precision: Annotated[Optional[str], typer.Option(help="Arithmetic of the runs [default: bf16 on GPUs, fp32 on "
                                                     "CPUs].")] = None,
    budget: Annotated[Optional[str], typer.Option(help="Time the whole tune may take, e.g. 20m [default: twice its "
                                                  "first round, at most 10m on CPUs and 30m on GPUs].")] = None,
    among: Annotated[Optional[str], typer.Option(help="Weigh only these splits, e.g. ddp,fsdp,ddp-pp2 [default: "
                                                 "every split of the cluster].")] = None,
    steps: Annotated[int, typer.Option(help="Measured steps of each run.", callback=COUNT.callback)] = 5,
    warmup: Annotated[Optional[int], typer.Option(help="Steps of each run left out before them [default: 2, 5 on "
                                                  "GPUs].", callback=Number(int, 0).callback)] = None,
    repeats: Annotated[int, typer.Option(help="Runs of each candidate in the first round (3: the fewest the study's "
                                         "paired test decides with).", callback=Number(int, 2).callback)] = 3,
    rounds: Annotated[int, typer.Option(help="At most this many rounds after the first.",
                                        callback=Number(int, 0, 100).callback)] = 10,
    halving: Annotated[bool, typer.Option(help="Repeat only the undecided candidates beside the top after each round "
                                          "(--no-halving: every candidate, every round).")] = True,
    resolve: Annotated[Optional[float], typer.Option(help="A throughput gap smaller than this counts as a tie "
                                                     "[default: the preset's study.added_repeats.resolve].",
                                                     callback=Number(float, 0, 0.99).callback)] = None,
    study: Annotated[Optional[list[Path]], typer.Option(
        "--study", help="A collected CPU study whose runs measure the CPU step model's error; repeatable [default: "
        "the stored studies under docs/reference].")] = None,
    profile: Annotated[Optional[Path], typer.Option(help=f"Snakemake profile the runs go through (e.g. "
                                                    f"{SLURM_PROFILE}) [default: this machine].")] = None,
    out: Annotated[Path, typer.Option(help="The tune's directory.")] = Path(TUNE_DIR),
    replace: Annotated[bool, typer.Option(help="Delete a previous tune in --out first.")] = False,
    dry_run: Annotated[bool, typer.Option(help="Plan the tune and say what it would measure; run nothing.")] = False,
) -> None:
    """Measure the planner's short list for this cluster: every split it cannot tell apart from its pick, and the best
    of each method and shape, in rounds that drop what is slower beyond the noise and repeat what is undecided,
    within a time budget; then the measured tiers (results/tune/summary.md) and a calibration for recommend."""
    from gpt2dist.config.planning import planned_gpus
    from gpt2dist.config.schema import PRECISIONS
    from gpt2dist.config.presets import load_params
    from gpt2dist.forecast.shortlist import Cluster
    from gpt2dist.pipeline.tune import Window
    from gpt2dist.system.conditions import run_cpus
    from gpt2dist.system.hardware import FORECAST_GPU, GPUS, command_output, gpu_memory_gb, named_in, visible_gpus
    from gpt2dist.system.links import links_of
    from gpt2dist.tune import Request, tune as run_tune

    gpus = planned_gpus(load_params(params), visible_gpus()) if gpus is None else gpus
    if gpus and (emulate_nodes or link_mbit):
        raise UsageError("--emulate-nodes and --link-mbit make nodes of this machine's CPUs; leave them out on GPUs "
                         "(or give --gpus 0)")
    if link_mbit and not emulate_nodes:
        raise UsageError("--link-mbit shapes emulated nodes' links; add --emulate-nodes N")
    if emulate_nodes and nodes > 1:
        raise UsageError("--nodes is a cluster's nodes and --emulate-nodes this machine's: give one of them")
    if gpus:
        seen = (command_output(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"]) or "").splitlines()
        gpu = gpu or next((name for name in seen if named_in(name, GPUS)), FORECAST_GPU)
        if nproc is not None and nproc != gpus * nodes:
            raise UsageError(f"--nproc {nproc}: a tune on GPUs runs a process per GPU, {gpus} per node on {nodes} "
                             f"node(s); leave --nproc out")
        cluster = Cluster("cuda", gpus * nodes, nodes, gpu=gpu, gpus_per_node=gpus,
                          links=links_of(gpu, link_inside, link_across, nics),
                          memory_gb=memory_gb or max(gpu_memory_gb(gpu)))
    else:
        if (gpu, memory_gb, link_inside, link_across, nics) != (None,) * 5:
            raise UsageError("--gpu, --memory-gb and the links describe GPUs, and this tune runs on CPUs; leave them "
                             "out, or give --gpus N")
        import psutil

        spread = emulate_nodes or nodes
        count = nproc or max(spread, len(run_cpus()) // spread * spread)
        per_machine = count if emulate_nodes or nodes == 1 else count // nodes
        cluster = Cluster("cpu", count, spread, bool(emulate_nodes), link_mbit,
                          memory_gb=psutil.virtual_memory().total / 1e9 / per_machine)
    chosen = precision or ("bf16" if gpus else "fp32")
    if chosen not in PRECISIONS:
        raise UsageError(f"--precision {chosen!r} is not one of {', '.join(PRECISIONS)}")
    window = Window(warmup if warmup is not None else 5 if gpus else 2, steps)
    request = Request(params, preset, cluster, chosen, out, size, seconds(budget), names(among), window, repeats,
                      rounds, halving, resolve, study, profile, replace, dry_run)
    run_tune(request, say)
