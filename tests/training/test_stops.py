"""A stop signal waits while a checkpoint and its run.json entry are written, and only then; a stop whose
exception Python dropped is raised at the next step; rank 0 reports where its loop ended even when its stop
arrives during that report. Real signals to a real process with the ranks' signal handling
(lifetime.stop_on_signals)."""

from __future__ import annotations

import subprocess
import sys

import pytest

SCRIPT = """
import os, signal, sys, time
from gpt2dist.errors import Interrupted
from gpt2dist.launch import lifetime
from gpt2dist.training import stops

class Finalized:
    def __del__(self):  # the stop's handler runs in here, and Python prints its exception and drops it
        os.kill(os.getpid(), signal.SIGTERM)

lifetime.stop_on_signals()
try:
    if sys.argv[1] == "inside":
        with stops.deferred():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.3)
            print("the section finished", flush=True)
    elif sys.argv[1].startswith("lost"):
        Finalized()
        print("ran on after the signal", flush=True)
        if sys.argv[1] == "lost-checked":
            stops.check()
        print("nothing stopped it", flush=True)
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
    ("lost-checked", ["ran on after the signal", "interrupted by SIGTERM"]),
    ("lost", ["ran on after the signal", "nothing stopped it"]),  # control: the stop is really lost until checked
])
def test_a_stop_waits_for_its_section_and_a_lost_one_for_the_next_check(where, printed):
    result = subprocess.run([sys.executable, "-c", SCRIPT, where], capture_output=True, text=True, timeout=50)
    assert result.stdout.splitlines() == printed, result.stderr
    assert ("Exception ignored in" in result.stderr) == where.startswith("lost"), result.stderr


REPORT_SCRIPT = """
import json, os, signal, sys
from pathlib import Path
from gpt2dist.errors import Interrupted
from gpt2dist.launch import lifetime
from gpt2dist.training.loop import _report_the_end
from gpt2dist.training.run_record import RankReport

class StopArrivesInTheFirstWrite(RankReport):
    writes = 0
    def update(self, **fields):
        self.writes += 1
        if self.writes == 1:
            os.kill(os.getpid(), signal.SIGTERM)  # its handler runs at the next call, inside this write
        super().update(**fields)

lifetime.stop_on_signals()
report = StopArrivesInTheFirstWrite(Path(sys.argv[2]), "attempt")
try:
    try:
        raise RuntimeError("a collective failed: a stopped peer had gone")
    except RuntimeError:
        if sys.argv[1] == "guarded":
            _report_the_end(report, 5)
        else:
            report.update(ended_at_step=5)
except Interrupted as stop:
    print(f"interrupted by {stop.signal_name}", flush=True)
print(json.loads(report.path.read_text()).get("ended_at_step") if report.path.exists() else "no report", flush=True)
"""


@pytest.mark.timeout(60)
@pytest.mark.parametrize("how, printed", [
    ("guarded", ["interrupted by SIGTERM", "5"]),
    ("plain", ["interrupted by SIGTERM", "no report"]),  # control: a stop inside the one write leaves no report
])
def test_rank_zero_reports_where_it_ended_when_its_stop_arrives_during_the_report(how, printed, tmp_path):
    result = subprocess.run([sys.executable, "-c", REPORT_SCRIPT, how, str(tmp_path)], capture_output=True,
                            text=True, timeout=50)
    assert result.stdout.splitlines() == printed, result.stderr
