"""The `gpt2dist` command: one subcommand per pipeline stage, in modules grouped as users meet them (run, study,
forecast, tune, tools). Thin: parse, call, exit code; the words and numbers are the layers' below.

Each command imports what it needs when it runs, so `gpt2dist verify` does not pay for torch.
"""

from __future__ import annotations

import signal
import sys

import typer

# each registers its commands, which `gpt2dist --help` lists in this order: a run, a study, forecasts, files
from gpt2dist.cli import runs, study, forecast, tune, tools  # noqa: F401, I001
from gpt2dist.cli.common import CLICK_ERROR, WARNING_CONTINUED, app
from gpt2dist.errors import error_line

__all__ = ["WARNING_CONTINUED", "app", "command_line", "run"]


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

    lifetime.run_then_exit_now(run)
