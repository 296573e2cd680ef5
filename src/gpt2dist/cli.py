"""The `gpt2dist` command: one subcommand per pipeline stage. Thin: parse, call, exit code.

Each command imports what it needs when it runs, so `gpt2dist verify` does not pay for
torch.
"""

from __future__ import annotations

import functools
import math
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Optional

import typer

from gpt2dist.config.schema import PRECISIONS
from gpt2dist.config.strategies import STRATEGIES
from gpt2dist.errors import Interrupted, UsageError, error_line
from gpt2dist.system.hardware import PEAK_FLOPS, gpu_memory_gb, named_in
from gpt2dist.system.links import ACROSS_NODES, INSIDE_NODE

# click's plain help: rich's boxed tables cut option names and wrap descriptions to a few words at 80 columns
app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False, rich_markup_mode=None,
                  context_settings={"max_content_width": 120})


# typer >= 0.29 vendors click, whose exceptions are then typer's own rather than the click package's
CLICK_ERROR = next(kind for kind in typer.BadParameter.__mro__ if kind.__name__ == "ClickException")


class Number:
    """A finite number within bounds, checked as the option is parsed (a typer callback): NaN and infinities
    pass a range check written as `x <= 0`, so they are refused by type before a command sees them."""

    def __init__(self, kind: type, low: float | None = None, high: float | None = None, *, above: bool = False):
        self.kind, self.low, self.high, self.above = kind, low, high, above

    def check(self, value):
        try:
            number = self.kind(value if isinstance(value, (int, float)) else str(value).strip())
        except ValueError:
            raise typer.BadParameter(f"'{value}' is not {'a whole number' if self.kind is int else 'a number'}") \
                from None
        if not math.isfinite(number):
            raise typer.BadParameter(f"'{value}' is not a finite number")
        if self.low is not None and (number <= self.low if self.above else number < self.low):
            raise typer.BadParameter(f"{number:g} is {'at or ' if self.above else ''}below {self.low:g}; it must be "
                                     f"{'above' if self.above else 'at least'} {self.low:g}")
        if self.high is not None and number > self.high:
            raise typer.BadParameter(f"{number:g} is above {self.high:g}")
        return number

    @property
    def callback(self) -> Callable:
        """The check as typer's option callback, which names the option in its message."""

        def checked(ctx: typer.Context, param: typer.CallbackParam, value: Optional[str]):
            if value is None:
                return None
            try:
                return self.check(value)
            except typer.BadParameter as exc:
                raise typer.BadParameter(exc.message, ctx=ctx, param=param) from None

        return checked


def numbers(text: str, option: str, number: Number, example: str) -> list:
    """A comma-separated list of `number`s (--memory-gb 80,40): each checked as the option itself would be."""
    try:
        return [number.check(part) for part in text.split(",")]
    except typer.BadParameter as exc:
        raise UsageError(f"{option} '{text}': {exc.message}; give a comma-separated list, e.g. {example}") from None


COUNT = Number(int, 1)  # processes, nodes, steps: at least one
GPU_COUNT = Number(int, 0)  # 0: CPU hosts
POSITIVE = Number(float, 0, above=True)

Params = Annotated[Path, typer.Option(help="Parameter file.")]


def _named_gpu(value: str | None) -> str | None:
    """A GPU this knows the peaks and memory of, named alone or inside a device name ("NVIDIA H100 80GB HBM3")."""
    if value is not None and named_in(value, PEAK_FLOPS) is None:
        raise typer.BadParameter(f"{value!r} names no GPU whose peaks are known: name one of {', '.join(PEAK_FLOPS)} "
                                 "(or a device name containing one), or leave it out for the H100")
    return value


GpuModel = Annotated[Optional[str], typer.Option(
    help=f"GPU whose peak FLOP/s sets the compute time ({', '.join(PEAK_FLOPS)}) [default: H100].",
    callback=_named_gpu)]
AssumedMfu = Annotated[Optional[float], typer.Option(
    help="Assumed model FLOP utilisation of the compute (llm.c on 8x H100: about 0.4) [default: 0.4].",
    callback=Number(float, 0, 1, above=True).callback)]
DEFAULT_GPU, DEFAULT_MFU = "H100", 0.4
LinkInside = Annotated[Optional[str], typer.Option(
    help=f"The link between a node's GPUs: {', '.join(INSIDE_NODE)} (*-host: peer-to-peer off, through host memory) "
         "[default: the GPU's usual node's].")]
LinkAcross = Annotated[Optional[str], typer.Option(
    help=f"The nodes' NICs: {', '.join(ACROSS_NODES)} [default: the GPU's usual node's].")]
Nics = Annotated[Optional[int], typer.Option(help="NICs per node [default: the GPU's usual node's].",
                                             callback=COUNT.callback)]
PresetName = Annotated[Optional[str], typer.Option(help="Preset; default: params.yaml's 'preset' (auto).")]
ModelSizes = Annotated[Optional[str], typer.Option(
    "--sizes", help="GPT-2 sizes of the preset's model to rank, e.g. small,medium,large,xl [default: the sizes the "
    "preset's runs name, else its own model].")]
Gpus = Annotated[Optional[int], typer.Option(
    help="Plan the study for this many GPUs per node (default: params.yaml's gpus_per_node, else the visible ones).",
    callback=GPU_COUNT.callback)]
Nodes = Annotated[Optional[int], typer.Option(
    help="Plan the study for a cluster of this many nodes (default: params.yaml's nodes, else 1).",
    callback=COUNT.callback)]
RunsDir = Annotated[Path, typer.Option(help="Directory holding one directory per run id.")]
Overrides = Annotated[Optional[list[str]], typer.Option("--set", metavar="KEY=VALUE",
                                                         help="Override a preset key: model.n_layer=2.")]


def _print_version(asked: bool) -> None:
    if asked:
        from gpt2dist import __version__

        typer.echo(f"gpt2dist {__version__}")
        raise typer.Exit()


@app.callback()
def main(version: Annotated[bool, typer.Option("--version", callback=_print_version, is_eager=True,
                                               help="Print gpt2dist's version and exit.")] = False) -> None:
    """Which parallel strategy trains GPT-2 fastest on this hardware, measured reproducibly."""


# Warnings a command's planning raised (configurations dropped), printed once the command has succeeded, each
# wrapped to the terminal with its continuation lines indented by this
_WARNINGS: list[str] = []
WARNING_CONTINUED = "  "


def say(text: str, err: bool = False, indent: str = "") -> None:
    """Prose for a reader: each line wrapped to the terminal's width, 100 columns at most (also where there is no
    terminal: a pipe, a file), its continuation lines indented by `indent`, blank lines kept. Tables are echoed as
    they are."""
    import shutil
    import textwrap

    width = min(100, shutil.get_terminal_size((100, 24)).columns)
    lines = [textwrap.fill(line, width, subsequent_indent=indent, break_long_words=False, break_on_hyphens=False)
             if line else "" for line in text.split("\n")]  # names and paths stay whole
    typer.echo("\n".join(lines), err=err)


def one_line_errors(command: Callable) -> Callable:
    """Bad input ends a command with one 'error: ...' line and exit status 2; a stop signal with one line
    and 128 + its number, as a shell reports it. Every command wears it."""

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        _WARNINGS.clear()  # this command's, not an earlier one's in the same process
        try:
            result = command(*args, **kwargs)
            for line in _WARNINGS:  # said after the answer: a refusal stays the one line it is
                say(line, err=True, indent=WARNING_CONTINUED)
            return result
        except UsageError as exc:
            typer.echo(error_line(exc), err=True)
            raise typer.Exit(2) from None
        except Interrupted as exc:
            typer.echo(error_line(exc), err=True)
            raise typer.Exit(128 + exc.signum) from None
        except KeyboardInterrupt:
            typer.echo(error_line("interrupted by SIGINT"), err=True)
            raise typer.Exit(128 + signal.SIGINT) from None
        except OSError as exc:  # the long tail of file trouble: permissions, a file for a directory, a full disk
            where = f"{exc.filename}: {exc.strerror}; check that path and its permissions" if exc.filename else exc
            typer.echo(error_line(where), err=True)
            raise typer.Exit(2) from None

    return wrapper


@app.command()
@one_line_errors
def train(
    data: Annotated[Path, typer.Option(help="Token shard directory (train.bin, val.bin, meta.json).")],
    strategy: Annotated[str, typer.Option(help=" | ".join(STRATEGIES) + " (`gpt2dist strategies` says what each is)")],
    out: Annotated[Path, typer.Option(help="Run directory: metrics.jsonl, run.json, checkpoint.pt.")],
    precision: Annotated[str, typer.Option(help=" | ".join(PRECISIONS))] = "fp32",
    nproc: Annotated[Optional[int], typer.Option(help="Processes (devices for dp), on all nodes together "
                                                 "[default: 1; with --hosts, their slots].",
                                                 callback=COUNT.callback)] = None,
    nodes: Annotated[int, typer.Option(help="Nodes of this SLURM job the processes spread over, nproc / nodes "
                                            "each (the pipeline's multi-node jobs pass it).",
                                       callback=COUNT.callback)] = 1,
    params: Params = Path("params.yaml"),
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
    if host_list:  # other machines' commands: their GPUs, not necessarily this host's
        from gpt2dist.config.planning import hosts_gpus
        from gpt2dist.system.hardware import visible_gpus

        slots = {host.name: host.slots for host in host_list}
        if nproc is not None and nproc != sum(slots.values()):
            raise UsageError(f"--nproc {nproc} disagrees with --hosts, whose slots add up to {sum(slots.values())}; "
                             "leave --nproc out (the slots say how many processes) or change the slots")
        host_gpus = hosts_gpus(params, gpus, visible_gpus(), slots)
        device = "cuda" if host_gpus else "cpu"
    if emulate_nodes is not None:
        device = "cpu"  # emulated nodes share this machine; its GPUs are not split between them
    if nodes != 1 and (host_list or emulate_nodes is not None):
        raise UsageError("--nodes is a SLURM job's nodes; --hosts and --emulate-nodes say their own")
    spread = len(host_list) if host_list else nodes  # emulated nodes: launch.emulated's, checked there
    spec = runner.build_spec(data=data, out=out, strategy=strategy, precision=precision,
                             nproc=sum(h.slots for h in host_list) if host_list else nproc or 1, params=params,
                             preset=preset, overrides=overrides, node_gpus=host_gpus, device=device,
                             nodes=spread, keep_checkpoint=keep_checkpoint, stale_checkpoint=stale_checkpoint,
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
    run: Annotated[Path, typer.Option(help="Run directory: its checkpoint.pt and run.json.")],
    out: Annotated[Path, typer.Option(help="Directory to write (new or empty): config.json, model.safetensors, the "
                                      "tokenizer's files, run.json, export.json.")],
) -> None:
    """Write a run's model as a transformers GPT-2 directory that GPT2LMHeadModel.from_pretrained loads offline."""
    from gpt2dist.training.hf_format import export_run

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
    """List the strategies: how each starts its processes, what it is, and what the papers call it."""
    if output_format not in ("table", "markdown"):
        raise UsageError(f"--format {output_format!r}: choose table or markdown")
    columns = ("strategy", "launcher", "what it is", "in the papers")
    rows = [(f"`{name}`" if output_format == "markdown" else name, d.launcher, d.summary,
             "; ".join(f"{paper}: {theirs}" for paper, theirs in d.papers.items())) for name, d in STRATEGIES.items()]
    if output_format == "markdown":
        from tabulate import tabulate

        typer.echo(tabulate(rows, headers=columns, tablefmt="github"))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title="gpt2dist strategies")
    for column in columns:
        table.add_column(column)
    for row in rows:
        table.add_row(*row)
    Console().print(table)


@app.command()
@one_line_errors
def prepare(
    out: Annotated[Path, typer.Option(help="Shard directory to write (train.bin, val.bin, tokenizer.json, meta.json).")],
    params: Params = Path("params.yaml"),
    preset: PresetName = None,
    set_: Overrides = None,
    progress: Annotated[bool, typer.Option(help="Show a progress bar.")] = True,
) -> None:
    """Tokenize the preset's corpus into verified uint16 token shards."""
    from gpt2dist.config.presets import resolve_preset
    from gpt2dist.data.prepare import prepare as run_prepare

    _, chosen = resolve_preset(params, preset, cuda=_cuda_visible(), overrides=list(set_ or []))
    typer.echo(_summary(out, run_prepare(chosen.data, out, progress=progress), "written"))


@app.command()
@one_line_errors
def verify(data_dir: Annotated[Path, typer.Argument(help="Shard directory.")]) -> None:
    """Re-check every shard's size and sha256 against meta.json."""
    from gpt2dist.data.shards import verify_shards

    typer.echo(_summary(data_dir, verify_shards(data_dir), "verified"))


def _cuda_visible() -> bool:
    """Whether CUDA GPUs are visible here (preset 'auto' picks paper then), without importing torch."""
    from gpt2dist.system.hardware import visible_gpus

    return visible_gpus() > 0


def _summary(directory: Path, meta: dict, verb: str) -> str:
    splits = ", ".join(f"{name} {entry['tokens']:,} tokens" for name, entry in meta["splits"].items())
    return f"ok: {directory}: {splits}, vocabulary {meta['vocab_size']:,} ({meta['tokenizer'].get('name')}), sha256 {verb}"


def _study(params: Path, preset: str | None, gpus: int | None = None, nodes: int | None = None):
    """The study planned for `gpus` per node (else params.yaml's gpus_per_node, else the visible GPUs) on
    `nodes` nodes (else params.yaml's nodes, else 1)."""
    from gpt2dist.config.planning import gpus_given, planned_gpus, planned_nodes
    from gpt2dist.pipeline.study import dropped_warning, plan_study
    from gpt2dist.system.hardware import visible_gpus

    study = plan_study(params, preset, planned_gpus(params, visible_gpus()) if gpus is None else gpus,
                       planned_nodes(params, nodes), gpus_given=gpus_given(params, gpus))
    if study.dropped:  # every command that plans says what it left out, and why
        _WARNINGS.append(dropped_warning(study))
    return study


@app.command()
@one_line_errors
def collect(
    runs: RunsDir = Path("results/runs"),
    data: Annotated[Path, typer.Option(help="Token shard directory the runs trained on.")] = Path("data/tokens"),
    out: Annotated[Path, typer.Option(help="Where metrics.csv, runs.csv, summary.csv and summary.json go.")] = Path("results"),
    params: Params = Path("params.yaml"),
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

    study = with_added_runs(_study(params, preset, gpus, nodes), out)
    result = run_collect(study, runs, data, out, mixed_hardware=mixed_hardware)
    typer.echo(f"ok: {len(result['configs'])} configurations of preset {result['preset']} summarised in {out}")


@app.command("add-round")
@one_line_errors
def add_round(
    round_: Annotated[int, typer.Option("--round", help="Which added round to decide (1 for the first).",
                                        callback=COUNT.callback)],
    runs: RunsDir = Path("results/runs"),
    data: Annotated[Path, typer.Option(help="Token shard directory the runs trained on.")] = Path("data/tokens"),
    results: Annotated[Path, typer.Option(help="The study's results directory (rounds/ is written there).")] =
    Path("results"),
    params: Params = Path("params.yaml"),
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

    study = _study(params, preset, gpus, nodes)
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
def plot(results: Annotated[Path, typer.Option(help="Directory written by `gpt2dist collect`.")] = Path("results")) -> None:
    """Draw the study's figures (PNG and SVG) from the collected tables."""
    from gpt2dist.results.inputs import read_summary

    read_summary(results)  # a missing or foreign summary is told before matplotlib loads
    from gpt2dist.results.plots import plot as run_plot

    typer.echo(f"ok: {len(run_plot(results))} figure files in {results / 'figures'}")


@app.command()
@one_line_errors
def report(
    results: Annotated[Path, typer.Option(help="Directory written by `gpt2dist collect`.")] = Path("results"),
    against: Annotated[Optional[list[Path]], typer.Option(
        help="Other stored studies to set each claim's verdict beside: a study's results directory, or a directory "
             "of them (docs/reference); those of another preset are skipped. Repeatable.")] = None,
) -> None:
    """Write results/summary.md and findings.md: the answer, the comparison table, the claims and the environment."""
    from gpt2dist.results.inputs import read_summary

    read_summary(results)  # a missing or foreign summary is told before pandas and scipy load
    for place in against or []:
        if place.exists() and not place.is_dir():
            raise UsageError(f"--against {place} is a file: give a study's results directory (one with summary.json), "
                             "or a directory of them such as docs/reference")
        if not place.exists():  # the pipeline names docs/reference, which a copy of the workflow may lack
            say(f"warning: --against {place}: no such directory, so no study there to compare with", err=True,
                indent=WARNING_CONTINUED)
    from gpt2dist.results.report import report as run_report

    typer.echo(f"ok: {run_report(results, against or [])}")


@app.command()
@one_line_errors
def bundle(
    out: Annotated[Path, typer.Option(help="Archive to write (.tar.gz).")],
    runs: RunsDir = Path("results/runs"),
    data: Annotated[Path, typer.Option(help="Token shard directory the runs trained on.")] = Path("data/tokens"),
    params: Params = Path("params.yaml"),
    preset: PresetName = None,
    gpus: Gpus = None,
    nodes: Nodes = None,
) -> None:
    """Pack the study's run records, shard description and parameters into one verifiable archive."""
    from gpt2dist.results.bundle import write_bundle

    description = write_bundle(_study(params, preset, gpus, nodes), runs, data, params, out)
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


def _cluster_unused(study) -> str:
    """What of the cluster the study's runs leave idle, said beside it: the runs are the preset's, not the cluster's."""
    nodes = max(run.nodes for run in study.runs)
    per_node = max(-(-run.nproc // run.nodes) for run in study.runs)
    unused = ([f"{nodes} node(s)"] if nodes < study.nodes else []) + (
        [f"{per_node} GPU(s) per node"] if per_node < study.gpus else [])
    return (f" (its runs use at most {' and '.join(unused)}: preset {study.preset_name}'s study.runs name no larger "
            "run; add one, with a global batch of at least micro-batch x GPUs, to use the rest)" if unused else "")


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


@app.command()
@one_line_errors
def plan(
    params: Params = Path("params.yaml"),
    preset: PresetName = None,
    gpus: Gpus = None,
    nodes: Nodes = None,
    gpu: GpuModel = None,
    mfu: AssumedMfu = None,
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
    from gpt2dist.config.memory import USABLE_SHARE
    from gpt2dist.results.plan import duration_words, fit_lines, plan_text, study_seconds
    from gpt2dist.results.plan import plan as plan_table
    from gpt2dist.results.published import published_summary, summary_words
    from gpt2dist.system.links import links_of

    if output_format not in ("table", "csv", "json"):
        raise UsageError(f"--format {output_format!r}: choose table, csv or json")
    sizes = numbers(memory_gb, "--memory-gb", POSITIVE, "80,40") if memory_gb is not None else None
    models = _model_sizes(model_sizes)
    study = _study(params, preset, gpus, nodes)
    if study.device != "cuda" and (gpu, mfu, link_inside, link_across, nics) != (None,) * 5:
        raise UsageError(f"--gpu, --mfu and the links set a GPU's step time, and preset '{study.preset_name}' is "
                         "planned here for CPUs; leave them out, or plan for GPUs with --gpus N")
    if budget_s is not None and not 0 < budget_s < math.inf:
        raise UsageError(f"--budget-s {budget_s:g}: give the seconds the study may take, above 0 (e.g. 540)")
    if budget_s is not None and (study.device != "cuda" or models):
        raise UsageError("--budget-s checks a study planned on GPUs at its own sizes: add --gpus N, and leave out "
                         "--sizes")
    gpu, mfu = gpu or DEFAULT_GPU, mfu or DEFAULT_MFU
    sizes = sizes or list(gpu_memory_gb(gpu))
    links = links_of(gpu, link_inside, link_across, nics)
    table = plan_table(study, gpu=gpu, mfu=mfu, memory_gb=sizes, links=links, sizes=models)
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

    on_gpus = study.device == "cuda"
    t, m = study.preset.train, study.preset.model
    each = f", {table['repeats'].iloc[0]} each" if table["repeats"].nunique() == 1 else ""
    say(f"Plan of preset {study.preset_name} ({len(study.runs)} runs of {table['config_id'].nunique()} configurations{each}) on "
        + (f"{study.nodes} node(s) of {study.gpus} {gpu} GPUs{_cluster_unused(study)}" if on_gpus else "CPUs")
        + ": a prediction, not a measurement.")
    say(f"Assumed: micro-batches of {t.micro_batch_size} sequences of {m.n_positions} tokens per rank, a global "
        f"batch of {t.global_batch_size} sequences (the rest by gradient accumulation), {t.max_steps} steps"
        + (f", compute at {mfu:.0%} MFU of the {gpu}'s peak." if on_gpus else ".") + "\n")
    by_size = "size" in table  # a study of model sizes, or --sizes: a table per size
    if not by_size:
        typer.echo(plan_text(table, sizes if on_gpus else []))
    for model_size, part in table.groupby("size", sort=False) if by_size else []:
        typer.echo(f"\nGPT-2 {model_size}, {part['parameters'].iloc[0] / 1e6:,.0f}M parameters:")
        ran = part[part["cannot_run"] == ""]
        if len(ran):
            typer.echo(plan_text(ran, sizes if on_gpus else []))
        for line in fit_lines(part, sizes if on_gpus else []):
            say(line)
    say("\nMemory per rank: the model state (parameters, gradients, AdamW's state) on the rank that holds the "
        "most, counted as every collected run checks it on rank 0; activations of one forward pass with the logits, and "
        "communication buffers, estimated (not yet checked on a GPU)"
        + (f". Spare is what is left of {USABLE_SHARE:.0%} of the GPU's memory, in GiB (the CUDA context and the "
           "allocator take the rest)." if on_gpus else "."))
    if on_gpus:
        say(f"Step time: single's FLOPs at an assumed MFU of {mfu:.0%} of the {gpu}'s peak, divided over the GPUs, "
            f"a pipeline's bubble, and the traffic model's bytes over {links.words(study.nodes)}, less what the "
            "strategy sends under its computation; "
            f"{summary_words(published_summary(mfu))}.")
        if duration is not None:
            say(duration_words(study, duration, budget_s))
    else:
        say("Step time on CPUs: `gpt2dist estimate` times this machine.")
    for line in fit_lines(table, sizes) if on_gpus and not by_size else []:
        say(line)
    if out:
        typer.echo(f"ok: {out}")


@app.command()
@one_line_errors
def recommend(
    gpus: Annotated[int, typer.Option(help="GPUs per node of the cluster.", callback=COUNT.callback)],
    nodes: Annotated[int, typer.Option(help="Nodes of the cluster.", callback=COUNT.callback)] = 1,
    gpu: GpuModel = None,
    memory_gb: Annotated[Optional[float], typer.Option(help="Memory of one GPU, GB [default: the most the --gpu "
                                                       "ships with].", callback=POSITIVE.callback)] = None,
    params: Params = Path("params.yaml"),
    preset: Annotated[str, typer.Option(help="Preset whose model and micro-batch to train.")] = "paper",
    precision: Annotated[str, typer.Option(help="Arithmetic of the runs.")] = "bf16",
    tokens: Annotated[float, typer.Option(help="Tokens to train.", callback=POSITIVE.callback)] = 1e10,
    mfu: AssumedMfu = None,
    link_inside: LinkInside = None,
    link_across: LinkAcross = None,
    nics: Nics = None,
    model_sizes: ModelSizes = None,
    studies: Annotated[Optional[list[Path]], typer.Option(
        "--study", help="A collected study (results directory) whose runs measure the model's error; repeatable. "
        "Default: the reference studies under docs/reference.")] = None,
) -> None:
    """Rank the strategies for a GPU cluster by predicted hours to train --tokens, with memory fit, an interval
    from the step-time model's leave-one-out error on stored studies, and what it extrapolates beyond."""
    from tabulate import tabulate

    from gpt2dist.config.presets import resolve_preset
    from gpt2dist.config.sizes import parameter_count
    from gpt2dist.pipeline.study import model_of, preset_sizes
    from gpt2dist.results.recommend import HIGH, LOW, extrapolations, read_stored, verdict_line
    from gpt2dist.results.recommend import recommend as ranked
    from gpt2dist.results.published import published_summary, summary_words
    from gpt2dist.system.links import links_of

    directories = studies or sorted(p.parent / p.name.removesuffix(".tar.gz")
                                    for p in (params.parent / "docs" / "reference").glob("*.tar.gz"))
    if not directories:
        raise UsageError("no stored study to measure the model's error on: pass --study <results directory>")
    stored = read_stored(directories)
    name, chosen = resolve_preset(params, preset, cuda=True)
    gpu, mfu = gpu or DEFAULT_GPU, mfu or DEFAULT_MFU
    memory_gb = memory_gb or max(gpu_memory_gb(gpu))
    links = links_of(gpu, link_inside, link_across, nics)
    sizes = _model_sizes(model_sizes) or preset_sizes(chosen)
    say(f"Recommendation (a prediction, not a measurement) for {nodes} node(s) of {gpus} {gpu} "
        f"({memory_gb:g} GB) linked by {links.words(nodes)}, preset {name}'s model"
        + (f" at {len(sizes)} sizes" if sizes != [None] else "") + f" in {precision}, {tokens:,.0f} tokens, each "
        f"GPU at the preset's micro-batch of {chosen.train.micro_batch_size} (a global batch that follows the GPUs: "
        f"{chosen.train.micro_batch_size * gpus * nodes} sequences), compute at an assumed MFU of {mfu:.0%}:")
    for size in sizes:
        table, errors = ranked(name, chosen, stored, gpu=gpu, gpus_per_node=gpus, nodes=nodes, precision=precision,
                               mfu=mfu, tokens=tokens, memory_gb=memory_gb, links=links, size=size)
        if size:
            model = model_of(chosen, size)
            say(f"\nGPT-2 {size}, {parameter_count(model) / 1e6:,.0f}M parameters:")
        typer.echo("")
        runnable = table[table["note"] == ""]
        shown = runnable[["strategy", "gpus", "fits", "peak_gib", "step_ms", "hours", "hours_low",
                          "hours_high"]].astype({"gpus": int})
        typer.echo(tabulate(shown, headers="keys", tablefmt="github", showindex=False, floatfmt=",.2f"))
        for row in table[table["note"] != ""].itertuples():
            say(f"{row.strategy}: {row.note}")
        say("\n" + verdict_line(runnable[runnable["fits"]]))
    def spread(column: str) -> str:
        e = errors[column].dropna()
        return f"median |error| {e.abs().median():.0%}, {e.quantile(LOW):+.0%} to {e.quantile(HIGH):+.0%}"

    corrected = any(s.device == "cuda" for s in stored)
    say(f"The step-time model's error (predicted / measured - 1, {LOW:.0%} to {HIGH:.0%} percentiles) on "
        f"{len(errors)} configurations of the stored studies ({', '.join(s.name for s in stored)}): as it "
        f"runs here, {spread('uncorrected_error')}; with each strategy's correction learned from its other "
        f"configurations (left out one at a time), {spread('error')}. The hours' intervals span the "
        f"{'corrected' if corrected else 'uncorrected'} errors' percentiles, the strategy's own where it "
        "has three or more.")
    for note in extrapolations(stored, gpus * nodes, nodes):
        say(f"Extrapolating: {note}.")
    say(f"On GPUs others measured: {summary_words(published_summary(mfu))}.")


@app.command("project-scaling")
@one_line_errors
def project_scaling(
    params: Params = Path("params.yaml"),
    preset: PresetName = None,
    gpu: GpuModel = None,
    precision: Annotated[str, typer.Option(help="Arithmetic of the projected runs.")] = "bf16",
    mfu: AssumedMfu = None,
    gpus_per_node: Annotated[int, typer.Option(help="GPUs per node.", callback=COUNT.callback)] = 8,
    nodes: Annotated[str, typer.Option(help="Node counts, e.g. 1,2,4,8.")] = "1,2,4,8",
    link_inside: LinkInside = None,
    link_across: LinkAcross = None,
    nics: Nics = None,
    model_sizes: ModelSizes = None,
) -> None:
    """Project a preset's data-parallel strategies to GPU clusters with the link model (a projection, not a
    measurement: compute from FLOPs at an assumed MFU, communication from the traffic model)."""
    from tabulate import tabulate

    from gpt2dist.config.presets import resolve_preset
    from gpt2dist.pipeline.study import preset_sizes
    from gpt2dist.results.link_model import projection
    from gpt2dist.system.links import links_of

    counts = numbers(nodes, "--nodes", COUNT, "1,2,4,8")
    name, chosen = resolve_preset(params, preset, cuda=_cuda_visible())
    gpu, mfu = gpu or DEFAULT_GPU, mfu or DEFAULT_MFU
    links = links_of(gpu, link_inside, link_across, nics)
    sizes = _model_sizes(model_sizes) or preset_sizes(chosen)
    table = projection(name, chosen, gpu=gpu, precision=precision, mfu=mfu, gpus_per_node=gpus_per_node,
                       node_counts=counts, links=links, sizes=sizes)
    projected = table["note"] == "projection"
    columns = ["size"] * (sizes != [None]) + ["strategy", "nodes", "gpus", "compute_ms", "communication_ms", "step_ms",
                                             "tokens_per_s", "scaling_efficiency"]
    say(f"Projection (not a measurement) of preset {name}: {gpu} {precision} at an assumed MFU of {mfu:.0%}, "
        f"{gpus_per_node} GPUs per node, {links.words(max(counts))}, weak scaling: each GPU at the preset's "
        f"micro-batch of {chosen.train.micro_batch_size}, the global batch growing with the GPUs; communication a "
        "strategy overlaps with its computation counts only where the computation cannot cover it.\n")
    typer.echo(tabulate(table.loc[projected, columns], headers="keys", tablefmt="github", showindex=False,
                        floatfmt=",.2f"))
    for row in table.loc[~projected].drop_duplicates(["size", "strategy"]).itertuples(index=False):
        say(f"\n{row.strategy}{f' ({row.size})' if row.size else ''}: {row.note}")


@app.command("validate-published")
@one_line_errors
def validate_published(
    mfu: AssumedMfu = None,
    table: Annotated[Optional[Path], typer.Option(help="A table of measurements in published_gpt2.csv's columns "
                                                   "[default: the one gpt2dist ships].")] = None,
    output_format: Annotated[str, typer.Option("--format", help="table (for a terminal), or csv or json: every row "
                                               "with its prediction, nothing else.")] = "table",
) -> None:
    """Hold the planner to GPT-2 training that others measured on GPUs and published: each row's throughput and
    memory predicted beside the published ones, and within each source's machine whether the planner orders every
    two rows as they were measured."""
    import pandas as pd
    from tabulate import tabulate

    from gpt2dist.results.published import TABLE, TIE, read_table, summary_words, validation

    if output_format not in ("table", "csv", "json"):
        raise UsageError(f"--format {output_format!r}: choose table, csv or json")
    mfu = mfu or DEFAULT_MFU
    predicted, ordered, summary = validation(read_table(table or TABLE), mfu)
    if output_format != "table":
        typer.echo(predicted.to_csv(index=False) if output_format == "csv" else predicted.to_json(orient="records",
                                                                                                  indent=1))
        return
    say(f"Published GPU measurements of GPT-2-family training against the planner (compute at an assumed MFU of "
        f"{mfu:.0%}; each row's links as its source describes them):\n")
    def shown(values, form: str) -> list[str]:
        return ["" if pd.isna(value) else format(value, form) for value in values]

    rows = predicted[predicted["left_out"] == ""]
    typer.echo(tabulate(
        {"row": rows["row"], "group": rows["group"], "strategy": rows["strategy"], "precision": rows["precision"],
         "GPUs": rows["gpus"], "nodes": rows["nodes"],
         "published ktok/s": shown(rows["published_tokens_per_s"] / 1e3, ",.1f"),
         "predicted ktok/s": shown(rows["predicted_tokens_per_s"] / 1e3, ",.1f"),
         "error": shown(rows["throughput_error"], "+.0%"), "published GiB": shown(rows["memory_gib"], ".1f"),
         "predicted GiB": shown(rows["predicted_memory_gib"], ".1f"), "memory error": shown(rows["memory_error"], "+.0%")},
        headers="keys", tablefmt="github", disable_numparse=True, colalign=("left",) * 4 + ("right",) * 8))
    typer.echo("")
    for group, part in ordered.groupby("group", sort=False):
        wrong = part[~part["ordered"]]
        say(f"{group}: {int(part['ordered'].sum())} of {len(part)} pairs ordered as published"
            + ("" if wrong.empty else "; not: " + ", ".join(
                f"{r.first} / {r.second} published {r.published_ratio:.2f}, predicted {r.predicted_ratio:.2f}"
                for r in wrong.itertuples())))
    for row in predicted[predicted["left_out"] != ""].itertuples():
        say(f"{row.row} ({row.group}) left out: {row.left_out}")
    say(f"\nIn all: {summary_words(summary)}. Pairs whose published throughputs are within "
        f"{TIE:.0%} of each other are ties, not counted. The table, with each row's source and what is unclear "
        f"about it: {table or 'src/gpt2dist/results/published_gpt2.csv'}.")


@app.command("dvc-yaml")
@one_line_errors
def dvc_yaml(
    out: Annotated[Path, typer.Option(help="File to write.")] = Path("dvc.yaml"),
    params: Params = Path("params.yaml"),
    preset: PresetName = None,
    gpus: Gpus = None,
    nodes: Nodes = None,
) -> None:
    """Write dvc.yaml for this machine's study: the same commands and paths as the Snakefile."""
    from gpt2dist.pipeline.dvc_stages import write_dvc_yaml

    study = _study(params, preset, gpus, nodes)
    write_dvc_yaml(study, out)
    typer.echo(f"ok: {out} with {len(study.runs)} train stages of preset {study.preset_name}")


@app.command()
@one_line_errors
def schema(out: Annotated[Path, typer.Option(help="File to write.")] = Path("workflow/schemas/params.schema.json")) -> None:
    """Write the JSON schema of params.yaml (Snakemake validates against it) from the typed config."""
    from gpt2dist.config.schema import write_params_schema

    write_params_schema(out)
    typer.echo(f"ok: {out}")


@app.command()
@one_line_errors
def doctor(
    no_gpu: Annotated[bool, typer.Option("--no-gpu", help="Skip GPU checks (image builds, CPU nodes).")] = False,
    gpus: Gpus = None,
    nodes: Nodes = None,
    params: Params = Path("params.yaml"),
    preset: PresetName = None,
) -> None:
    """Check this environment and list what the chosen preset's study needs but is missing."""
    from rich.console import Console
    from rich.table import Table

    from gpt2dist.system.doctor import facts, missing_for

    study = _study(params, preset, gpus, nodes)
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
def estimate(
    params: Params = Path("params.yaml"),
    preset: PresetName = None,
    gpus: Gpus = None,
    nodes: Nodes = None,
    runs: RunsDir = Path("results/runs"),
    out: Annotated[Path, typer.Option(help="JSON file with the expected seconds of every job.")] = Path(
        "results/estimate.json"),
) -> None:
    """Time a few steps of the preset's model here and print how long the rest of the study will take."""
    from gpt2dist.pipeline.duration import estimate_line, finished_runs, write_estimate
    from gpt2dist.pipeline.study import configurations, selftest_file
    from gpt2dist.selftest import CALIBRATION_STEPS, calibrate
    from gpt2dist.system.conditions import run_cpus
    from gpt2dist.system.hardware import visible_gpus

    study = _study(params, preset, gpus, nodes)
    finished = finished_runs(study, runs)
    if len(finished) == len(study.runs):
        typer.echo(f"estimate: all {len(study.runs)} runs of preset '{study.preset_name}' are done; nothing to time")
        return
    if study.device == "cuda" and not visible_gpus():
        typer.echo(f"estimate: none made here: preset '{study.preset_name}' trains on GPUs and this host has none "
                   "(a cluster's login node); each finished run prints how many are done")
        return
    precisions = sorted({run.precision for run in study.runs})
    typer.echo(f"estimate: timing {CALIBRATION_STEPS} steps of preset '{study.preset_name}''s model in "
               f"{' and '.join(precisions)}, one process...")
    checked = {run.config_id for run in configurations(study) if Path(selftest_file(run)).exists()}
    typer.echo(estimate_line(write_estimate(study, calibrate(study, params), len(run_cpus()), out), finished, checked))


@app.command()
@one_line_errors
def progress(
    params: Params = Path("params.yaml"),
    preset: PresetName = None,
    gpus: Gpus = None,
    nodes: Nodes = None,
    runs: RunsDir = Path("results/runs"),
    estimate: Annotated[Path, typer.Option(help="Written by `gpt2dist estimate`.")] = Path("results/estimate.json"),
) -> None:
    """Print how many runs of the study are done and about how long the rest takes."""
    from gpt2dist.pipeline.duration import finished_runs, progress_line
    from gpt2dist.results.inputs import read_json

    study = _study(params, preset, gpus, nodes)
    planned = read_json(estimate, "gpt2dist estimate") if estimate.exists() else None
    typer.echo(progress_line(study, finished_runs(study, runs), planned))


@app.command()
@one_line_errors
def selftest(
    params: Params = Path("params.yaml"),
    preset: PresetName = None,
    out: Annotated[Path, typer.Option(help="JSON file with every check's result.")] = Path("results/selftest.json"),
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
    if gpus is not None:  # the pipeline's jobs pass the plan's count: a stale dvc.yaml shows here first
        check_plan_fits(params, gpus, visible_gpus())
    study = _study(params, preset, gpus, nodes)

    def progress(check, done: int, total: int) -> None:
        verdict = "ok" if check.ok else f"FAILED: {check.error}"
        console.print(f"[{done}/{total}] {check.name}: {verdict} ({check.seconds:.1f} s)", markup=False)

    if resume and not only:
        raise UsageError("--resume goes with --only (without it, every strategy's resume is checked)")
    checks = run_selftest(study, params, out, only=only, resume=resume, timeout_s=timeout, report=progress)
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


def run() -> None:
    """The `gpt2dist` command: a value the parser refuses (a bad number, an unknown option, a missing argument)
    ends in one 'error:' line and status 2 like every other bad input, not click's usage block."""
    try:
        status = app(prog_name="gpt2dist", standalone_mode=False)
    except CLICK_ERROR as exc:
        command = exc.ctx.command_path if getattr(exc, "ctx", None) else "gpt2dist"
        typer.echo(error_line(f"{exc.format_message()} (see {command} --help)"), err=True)
        sys.exit(2)
    except typer.Abort:
        typer.echo(error_line("interrupted by SIGINT"), err=True)
        sys.exit(128 + signal.SIGINT)
    sys.exit(status if isinstance(status, int) else 0)


def command_line() -> None:
    """The installed `gpt2dist` and `python -m gpt2dist`: run(), then end without interpreter shutdown
    (lifetime.exit_now), which added up to 1.4 s to every run and pipeline job that loaded torch."""
    from gpt2dist.launch import lifetime

    try:
        run()
    except SystemExit as end:
        if not isinstance(end.code, int | None):
            raise
        lifetime.exit_now(end.code or 0)
