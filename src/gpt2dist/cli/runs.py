"""Commands of one run and its data: train, export, the strategies, prepare and verify the shards, and the checks of an
environment (doctor, selftest)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from gpt2dist.cli.common import (COUNT, DEFAULT_PARAMS, GPU_COUNT, POSITIVE, Gpus, Nodes, Number, Overrides, Params,
                                 PresetName, app, cuda_visible, one_line_errors, planned_study, say)
from gpt2dist.config.schema import PRECISIONS
from gpt2dist.config.split import EXAMPLES
from gpt2dist.config.strategies import STRATEGIES, describe
from gpt2dist.errors import UsageError
from gpt2dist.pipeline.layout import RUNS_DIR, SELFTEST_REPORT


@app.command()
@one_line_errors
def train(
    data: Annotated[Path, typer.Option(help="Token shard directory (train.bin, val.bin, meta.json).")],
    strategy: Annotated[str, typer.Option(help=" | ".join(STRATEGIES) + " (`gpt2dist strategies` says what each is), "
                                          f"or a split: a data-parallel method with degrees, such as {EXAMPLES}")],
    out: Annotated[Path, typer.Option(help="Run directory: metrics.jsonl, run.json, checkpoint.pt, TensorBoard's "
                                      "event file, kept/ (each rank's trace).")],
    precision: Annotated[str, typer.Option(help=" | ".join(PRECISIONS))] = "fp32",
    nproc: Annotated[Optional[int], typer.Option(help="Processes (devices for dp), on all nodes together "
                                                 "[default: 1; with --hosts, their slots].",
                                                 callback=COUNT.callback)] = None,
    nodes: Annotated[int, typer.Option(help="Nodes of this SLURM job the processes spread over, nproc / nodes "
                                            "each (the pipeline's multi-node jobs pass it).",
                                       callback=COUNT.callback)] = 1,
    params: Params = DEFAULT_PARAMS,
    preset: PresetName = None,
    set_: Overrides = None,
    max_steps: Annotated[Optional[int], typer.Option(help="Shorthand for --set train.max_steps=K.",
                                                     callback=COUNT.callback)] = None,
    seed: Annotated[Optional[int], typer.Option(help="Shorthand for --set train.seed=S.",
                                                callback=Number(int, 0).callback)] = None,
    size: Annotated[Optional[str], typer.Option(help="The preset's model at this size: GPT-2's small, medium, large "
                                                "or xl, or a name of the preset's study.model_sizes (before --set).")] = None,
    hosts: Annotated[Optional[str], typer.Option(help="HOST:SLOTS,... : print the multi-node commands.")] = None,
    gpus: Annotated[Optional[int], typer.Option(help="With --hosts: GPUs per host, 0 for CPU hosts (default: "
                                                "params.yaml's gpus_per_node, else this host's).",
                                                callback=GPU_COUNT.callback)] = None,
    emulate_nodes: Annotated[Optional[int], typer.Option(help="Run the multi-node commands on this many nodes "
                                                         "emulated on this machine (network namespaces; root).",
                                                         callback=COUNT.callback)] = None,
    link_mbit: Annotated[Optional[float], typer.Option(help="With --emulate-nodes: each node's link bandwidth, "
                                                       "Mbit/s each way (default: unshaped).",
                                                       callback=POSITIVE.callback)] = None,
    print_command: Annotated[bool, typer.Option(help="Print the launcher command instead of running it.")] = False,
    keep_checkpoint: Annotated[bool, typer.Option(help="Keep checkpoint.pt once the run completes.")] = True,
    final_checkpoint_in_kept: Annotated[bool, typer.Option(help="Once the run completes, move checkpoint.pt into "
                                                           "kept/, which a workflow tool declares as an output (the "
                                                           "pipeline's).")] = False,
    stale_checkpoint: Annotated[str, typer.Option(help="A checkpoint of other settings in --out: fail, or restart "
                                                  "afresh (for workflow tools re-running a changed job).")] = "fail",
    resume_from: Annotated[Optional[Path], typer.Option(help="Continue another run's checkpoint (its checkpoint.pt or "
                                                        "directory) under this strategy and process count, when --out "
                                                        "has none of its own.")] = None,
    init_from: Annotated[Optional[Path], typer.Option(help="Start from the weights of a transformers GPT-2 directory "
                                                      "(config.json, model.safetensors: save_pretrained's) of the "
                                                      "preset's shape, instead of a random init.")] = None,
) -> None:
    """Train GPT-2 with one strategy; re-running the same command resumes from the last checkpoint."""
    from gpt2dist.config.presets import load_params
    from gpt2dist.launch import commands, emulated, runner

    overrides = list(set_ or [])
    if max_steps is not None:
        overrides.append(f"train.max_steps={max_steps}")
    if seed is not None:
        overrides.append(f"train.seed={seed}")
    host_list = commands.parse_hosts(hosts) if hosts else None
    if gpus is not None and not host_list:
        raise UsageError("--gpus describes the --hosts machines; a run on this machine uses the GPUs it sees")
    device, host_gpus = None, None
    loaded = load_params(params)
    if host_list:  # other machines' commands: their GPUs, not necessarily this host's
        from gpt2dist.config.planning import hosts_gpus
        from gpt2dist.system.hardware import visible_gpus

        slots = {host.name: host.slots for host in host_list}
        if nproc is not None and nproc != sum(slots.values()):
            raise UsageError(f"--nproc {nproc} disagrees with --hosts, whose slots add up to {sum(slots.values())}; "
                             "leave --nproc out (the slots say how many processes) or change the slots")
        host_gpus = hosts_gpus(loaded, gpus, visible_gpus(), slots)
        device = "cuda" if host_gpus else "cpu"
    if emulate_nodes is not None:
        device = "cpu"  # emulated nodes share this machine; its GPUs are not split between them
    if nodes != 1 and (host_list or emulate_nodes is not None):
        raise UsageError("--nodes is a SLURM job's nodes; --hosts and --emulate-nodes say their own")
    spread = len(host_list) if host_list else nodes  # emulated nodes: launch.emulated's, checked there
    spec = runner.build_spec(data=data, out=out, strategy=strategy, precision=precision,
                             nproc=sum(h.slots for h in host_list) if host_list else nproc or 1, params=loaded,
                             preset=preset, overrides=overrides, node_gpus=host_gpus, device=device,
                             nodes=spread, keep_checkpoint=keep_checkpoint,
                             final_checkpoint_in_kept=final_checkpoint_in_kept, stale_checkpoint=stale_checkpoint,
                             resume_from=resume_from, size=size, init_from=init_from)
    if host_list:
        typer.echo("\n".join(runner.print_multinode(spec, host_list)))
        return
    if link_mbit is not None and emulate_nodes is None:
        raise UsageError("--link-mbit shapes emulated nodes' links; add --emulate-nodes N")
    emulation = emulated.Emulation(emulate_nodes, link_mbit) if emulate_nodes is not None else None
    shown = runner.start(spec, print_only=print_command, emulation=emulation)
    if print_command:
        typer.echo(shown)


@app.command()
@one_line_errors
def export(
    run: Annotated[Path, typer.Option(help="Run directory (its checkpoint.pt, or the final one a study kept in kept/, "
                                      "and run.json), or the id of a run of the study here, in results/runs.")],
    out: Annotated[Path, typer.Option(help="Directory to write (new or empty): config.json, model.safetensors, the "
                                      "tokenizer's files, run.json, export.json.")],
) -> None:
    """Write a run's model as a transformers GPT-2 directory that GPT2LMHeadModel.from_pretrained loads offline."""
    from gpt2dist.training.hf_format import export_run

    if not run.exists() and len(run.parts) == 1 and (Path(RUNS_DIR) / run).is_dir():  # a run id (summary.md's)
        run = Path(RUNS_DIR) / run
    done = export_run(run, out)
    tokenizer = done["tokenizer"]["name"] if done["tokenizer"] else f"none ({done['no_tokenizer']})"
    say(f"ok: {out}: GPT-2 of {done['parameters']:,} parameters ({done['dtype']}) from {run} at step "
        f"{done['checkpoint_step']}; tokenizer: {tokenizer}")


@app.command()
@one_line_errors
def strategies(
    output_format: Annotated[str, typer.Option("--format", help="table (for a terminal) or markdown (the README's "
                                               "table, which a test keeps equal to this)")] = "table",
) -> None:
    """List the strategies: how each starts its processes, which engine runs it, what it is, and what the papers call
    it; then each data-parallel method as a split's (ddp-tp2, fsdp-pp2, tp2-pp2, ...)."""
    from gpt2dist.config.methods import METHODS, NONE
    from gpt2dist.config.split import composed_name

    if output_format not in ("table", "markdown"):
        raise UsageError(f"--format {output_format!r}: choose table or markdown")
    code = (lambda name: f"`{name}`") if output_format == "markdown" else str
    named = [(code(name), d.launcher, d.engine_words, d.summary,
              "; ".join(f"{paper}: {theirs}" for paper, theirs in d.papers.items())) for name, d in STRATEGIES.items()]
    in_splits = [(code(composed_name(name, 2, 1)) + (", " + code(composed_name(name, 1, 2))), method.in_a_split,
                  describe(composed_name(name, 2, 1)).engine_words.removesuffix(" + DTensor tensor parallel"))
                 for name, method in METHODS.items() if method.composes and name != NONE]
    tables = [(("strategy", "launcher", "engine", "what it is", "in the papers"), named, "gpt2dist strategies"),
              (("in a split", "each replica", "engine of the data-parallel part (then DTensor, pipelining)"),
               in_splits, "the data-parallel methods inside a split")]
    if output_format == "markdown":
        from tabulate import tabulate

        typer.echo("\n\n".join(tabulate(rows, headers=columns, tablefmt="github") for columns, rows, _ in tables))
        return
    from rich.console import Console
    from rich.table import Table

    for columns, rows, title in tables:
        table = Table(title=title)
        for column in columns:
            table.add_column(column)
        for row in rows:
            table.add_row(*row)
        Console().print(table)


@app.command()
@one_line_errors
def prepare(
    out: Annotated[Path, typer.Option(help="Shard directory to write (train.bin, val.bin, tokenizer.json, meta.json).")],
    params: Params = DEFAULT_PARAMS,
    preset: PresetName = None,
    set_: Overrides = None,
    progress: Annotated[bool, typer.Option(help="Show a progress bar.")] = True,
) -> None:
    """Tokenize the preset's corpus into verified uint16 token shards."""
    from gpt2dist.config.presets import load_params
    from gpt2dist.data.prepare import prepare as run_prepare

    _, chosen = load_params(params).preset(preset, cuda=cuda_visible(), overrides=list(set_ or []))
    typer.echo(_summary(out, run_prepare(chosen.data, out, progress=progress), "written"))


@app.command()
@one_line_errors
def verify(data_dir: Annotated[Path, typer.Argument(help="Shard directory.")]) -> None:
    """Re-check every shard's size and sha256 against meta.json."""
    from gpt2dist.data.shards import verify_shards

    typer.echo(_summary(data_dir, verify_shards(data_dir), "verified"))


def _summary(directory: Path, meta: dict, verb: str) -> str:
    splits = ", ".join(f"{name} {entry['tokens']:,} tokens" for name, entry in meta["splits"].items())
    return f"ok: {directory}: {splits}, vocabulary {meta['vocab_size']:,} ({meta['tokenizer'].get('name')}), sha256 {verb}"


@app.command()
@one_line_errors
def doctor(
    no_gpu: Annotated[bool, typer.Option("--no-gpu", help="Skip GPU checks (image builds, CPU nodes).")] = False,
    gpus: Gpus = None,
    nodes: Nodes = None,
    params: Params = DEFAULT_PARAMS,
    preset: PresetName = None,
) -> None:
    """Check this environment and list what the chosen preset's study needs but is missing."""
    from rich.console import Console
    from rich.table import Table

    from gpt2dist.system.doctor import facts, missing_for

    study = planned_study(params, preset, gpus, nodes)
    table = Table(title=f"gpt2dist doctor: preset {study.preset_name} on {study.device}")
    for column in ("check", "found", "for this study"):
        table.add_column(column)
    for fact in facts(no_gpu, study):
        table.add_row(fact.name, fact.value, fact.status)
    Console().print(table)
    missing = missing_for(study, no_gpu)
    if missing:
        raise UsageError(f"preset '{study.preset_name}' needs what is missing here: " + "; ".join(missing))
    typer.echo(f"ok: everything preset '{study.preset_name}' ({len(study.runs)} runs) needs is here")


@app.command()
@one_line_errors
def selftest(
    params: Params = DEFAULT_PARAMS,
    preset: PresetName = None,
    out: Annotated[Path, typer.Option(help="JSON file with every check's result.")] = Path(SELFTEST_REPORT),
    timeout: Annotated[float, typer.Option(help="Seconds one check may take before it counts as hung.",
                                           callback=POSITIVE.callback)] = 600,
    only: Annotated[Optional[list[str]], typer.Option(
        help="Check only this configuration (e.g. ddp-bf16-n2); repeatable.")] = None,
    resume: Annotated[bool, typer.Option(help="With --only: also kill and resume each of them.")] = False,
    gpus: Gpus = None,
    nodes: Nodes = None,
) -> None:
    """Run every configuration of the study for a few steps, and one resume per strategy: minutes, not hours."""
    from rich.console import Console
    from rich.table import Table

    from gpt2dist.config.planning import check_plan_fits
    from gpt2dist.selftest import run_selftest
    from gpt2dist.system.hardware import visible_gpus

    console = Console(highlight=False)
    study = planned_study(params, preset, gpus, nodes)
    if gpus is not None:  # the pipeline's jobs pass the plan's count: a stale dvc.yaml shows here first
        check_plan_fits(study.params, gpus, visible_gpus())

    def progress(check, done: int, total: int) -> None:
        verdict = "ok" if check.ok else f"FAILED: {check.error}"
        console.print(f"[{done}/{total}] {check.name}: {verdict} ({check.seconds:.1f} s)", markup=False)

    if resume and not only:
        raise UsageError("--resume goes with --only (without it, every strategy's resume is checked)")
    checks = run_selftest(study, out, only=only, resume=resume, timeout_s=timeout, report=progress)
    table = Table(title=f"gpt2dist selftest: preset {study.preset_name} on {study.device}")
    for column in ("check", "result", "seconds", "error"):
        table.add_column(column)
    for check in checks:
        table.add_row(check.name, "ok" if check.ok else "failed", f"{check.seconds:.1f}", check.error)
    console.print(table)
    failed = [check.name for check in checks if not check.ok]
    if failed:
        raise UsageError(f"selftest: {len(failed)} of {len(checks)} checks failed ({', '.join(failed)}); "
                         f"each error is in the table above and in {out}")
    typer.echo(f"ok: all {len(checks)} checks of preset '{study.preset_name}' passed ({out})")
