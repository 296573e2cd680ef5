"""Every command's --help reads in a terminal of 80 or 120 columns: no line runs past the edge, every option's
name is whole, and flags carry no type placeholder."""

from __future__ import annotations

import re

import pytest
import typer
from click.testing import CliRunner

from gpt2dist.cli import app

COMMAND = typer.main.get_command(app)


def problems(text: str, width: int, names: list[str]) -> list[str]:
    found = [f"{len(line)} columns: {line!r}" for line in text.splitlines() if len(line) > width]
    found += [f"{name} is not whole" for name in names if not re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", text)]
    found += [f"a flag's placeholder: {line.strip()!r}" for line in text.splitlines() if "<bool>" in line]
    return found


@pytest.mark.parametrize("width", [80, 120])
@pytest.mark.parametrize("name", sorted(COMMAND.commands))
def test_help_fits_the_terminal_and_names_every_option_whole(name, width):
    result = CliRunner().invoke(COMMAND, [name, "--help"], env={"COLUMNS": str(width)}, terminal_width=width)
    assert result.exit_code == 0, result.output
    options = [opt for param in COMMAND.commands[name].params for opt in param.opts + param.secondary_opts
               if opt.startswith("--")]
    assert problems(result.output, width, options) == []


def test_the_check_catches_a_cut_name_a_long_line_and_a_flags_placeholder():
    """Negative control, on help as rich's boxed tables printed it at 80 columns."""
    boxed = ("│    --stale-checkpoi…  <str>  A checkpoint of other  │\n"
             "│    --help             <bool> Show this message and exit.                                 │\n")
    found = problems(boxed, 80, ["--stale-checkpoint", "--help"])
    assert any("--stale-checkpoint is not whole" in p for p in found)
    assert any(" columns: " in p for p in found) and any("placeholder" in p for p in found)
