"""What every command shares: the app, the options' types and checks, prose wrapped to the terminal, one error
line for bad input, and the study planned from the options."""

from __future__ import annotations

import functools
import math
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Optional

import typer

from gpt2dist.errors import Interrupted, UsageError, error_line
from gpt2dist.pipeline.layout import PARAMS_FILE
from gpt2dist.system.hardware import FORECAST_GPU, GPUS, named_in
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
DEFAULT_PARAMS = Path(PARAMS_FILE)


def _named_gpu(value: str | None) -> str | None:
    """A GPU this knows the peaks and memory of, named alone or inside a device name ("NVIDIA H100 80GB HBM3")."""
    if value is not None and named_in(value, GPUS) is None:
        raise typer.BadParameter(f"{value!r} names no GPU whose peaks are known: name one of {', '.join(GPUS)} "
                                 f"(or a device name containing one), or leave it out for the {FORECAST_GPU}")
    return value


GpuModel = Annotated[Optional[str], typer.Option(
    help=f"GPU whose datasheet (peak FLOP/s, memory bandwidth) prices the step ({', '.join(GPUS)}) "
         f"[default: {FORECAST_GPU}].",
    callback=_named_gpu)]
AssumedMfu = Annotated[Optional[float], typer.Option(
    help="Price the computation at this model FLOP utilisation instead of the GPU step model (the planner's model "
         "before it; llm.c on 8x H100: about 0.4) [default: the GPU step model].",
    callback=Number(float, 0, 1, above=True).callback)]
GpuMemory = Annotated[Optional[float], typer.Option(
    help="Memory of one GPU, GB [default: the most the --gpu ships with].", callback=POSITIVE.callback)]
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
Calibration = Annotated[Optional[Path], typer.Option(
    help="estimate.json that `gpt2dist estimate` wrote on a GPU node of this cluster: the GPU step model's computation "
         "corrected by single's steps it timed there [default: none].")]


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
    they are, and so is a line indented by four spaces (Markdown's code line): a command to copy, whole."""
    import shutil
    import textwrap

    width = min(100, shutil.get_terminal_size((100, 24)).columns)
    lines = [textwrap.fill(line, width, subsequent_indent=indent, break_long_words=False, break_on_hyphens=False)
             if line and not line.startswith("    ") else line
             for line in text.split("\n")]  # names and paths stay whole
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


def cuda_visible() -> bool:
    """Whether CUDA GPUs are visible here (preset 'auto' picks paper then), without importing torch."""
    from gpt2dist.system.hardware import visible_gpus

    return visible_gpus() > 0


def planned_study(params: Path, preset: str | None, gpus: int | None = None, nodes: int | None = None):
    """The study planned for `gpus` per node (else params.yaml's gpus_per_node, else the visible GPUs) on
    `nodes` nodes (else params.yaml's nodes, else 1)."""
    from gpt2dist.config.planning import gpus_given, planned_gpus, planned_nodes
    from gpt2dist.config.presets import load_params
    from gpt2dist.pipeline.study import dropped_warning, plan_study
    from gpt2dist.system.hardware import visible_gpus

    loaded = load_params(params)
    study = plan_study(loaded, preset, planned_gpus(loaded, visible_gpus()) if gpus is None else gpus,
                       planned_nodes(loaded, nodes), gpus_given=gpus_given(loaded, gpus))
    if study.dropped:  # every command that plans says what it left out, and why
        _WARNINGS.append(dropped_warning(study))
    return study
