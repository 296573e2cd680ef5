"""A stop signal waits while a checkpoint and its run.json entry are written, and only then: real
SIGTERMs to a real process with the ranks' signal handling (lifetime.stop_on_signals)."""

from __future__ import annotations

import subprocess
import sys

import pytest

SCRIPT = """
import os, signal, sys, time
from gpt2dist.errors import Interrupted
from gpt2dist.launch import lifetime
from gpt2dist.training import stops

lifetime.stop_on_signals()
try:
    if sys.argv[1] == "inside":
        with stops.deferred():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.3)
            print("the section finished", flush=True)
    else:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.3)
        print("ran on after the signal", flush=True)
except Interrupted as stop:
    print(f"interrupted by {stop.signal_name}", flush=True)
"""


@pytest.mark.timeout(60)
@pytest.mark.parametrize("where, printed", [
    ("inside", ["the section finished", "interrupted by SIGTERM"]),
    ("outside", ["interrupted by SIGTERM"]),  # negative control: without a section the stop is immediate
])
def test_a_stop_inside_a_deferred_section_is_raised_when_it_ends(where, printed):
    result = subprocess.run([sys.executable, "-c", SCRIPT, where], capture_output=True, text=True, timeout=50)
    assert result.stdout.splitlines() == printed, result.stderr
