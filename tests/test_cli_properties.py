"""Property-based: any value of a numeric option, any text, NaN, infinities, zero and negatives, ends either in
the command's answer (status 0) or in exactly one 'error:' line with status 2, never a traceback. Run in this
process through the command's own entry point (as `gpt2dist` runs), seeded and bounded in examples."""

from __future__ import annotations

import contextlib
import io
import sys

import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from gpt2dist.cli import run

from conftest import REPO

PARAMS = str(REPO / "params.yaml")
# each command with the arguments that make it valid, and its numeric options (a list option takes a list)
COMMANDS = {
    "plan": (["--params", PARAMS, "--preset", "paper", "--gpus", "8"], ["--mfu", "--gpus", "--nodes", "--memory-gb"]),
    "recommend": (["--params", PARAMS, "--gpus", "8"], ["--gpus", "--nodes", "--memory-gb", "--tokens", "--mfu"]),
    "project-scaling": (["--params", PARAMS, "--preset", "paper"], ["--mfu", "--gpus-per-node", "--nodes"]),
}
CASES = [(command, option) for command, (_, options) in COMMANDS.items() for option in options]
NUMBERS = st.one_of(
    st.sampled_from(["nan", "inf", "-inf", "NaN", "1e999", "0", "-0", "-1", "", " ", "1,", ",", "0x10", "1_0"]),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.integers(min_value=-10**20, max_value=10**20).map(str),
    st.text(max_size=6),
)


def invoke(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    argv, sys.argv = sys.argv, ["gpt2dist", *args]
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), pytest.raises(SystemExit) as ended:
            run()
    finally:
        sys.argv = argv
    return ended.value.code, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("command, option", CASES, ids=[f"{c}{o}" for c, o in CASES])
@seed(20261126)
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=NUMBERS)
def test_any_value_is_an_answer_or_one_error_line(command, option, value):
    base, _ = COMMANDS[command]
    args = [*base, option, value] if option not in base else \
        [*base[:base.index(option)], option, value, *base[base.index(option) + 2:]]
    code, out, err = invoke(command, *args)
    assert "Traceback" not in out + err
    if code == 0:
        assert out.strip() and not err.strip(), (value, err)
        return
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), (value, code, err)


@pytest.mark.parametrize("args, message", [
    (["plan", "--mfu", "nan"], "error: Invalid value for '--mfu': 'nan' is not a finite number"),
    (["recommend", "--gpus", "8", "--tokens", "-inf"], "error: Invalid value for '--tokens': '-inf' is not a finite"),
    (["plan", "--memory-gb", "80,nan"], "error: --memory-gb '80,nan': 'nan' is not a finite number"),
    (["plan", "--frobnicate"], "error: No such option: --frobnicate"),
])
def test_the_error_names_the_option_and_the_problem(args, message):
    """The property's control, each a case it fails without the typed options: before them, `recommend --tokens
    nan` answered with status 0, 'nan tokens' and a table of nan hours, and an unknown option gave click's
    usage block instead of one line."""
    code, _, err = invoke(*args)
    assert code == 2 and err.startswith(message), err
