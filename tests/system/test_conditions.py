"""The load monitor tells the run's own work from other processes' with real busy processes:
a hog that is not the run shows up, the run's children and its srun-started ranks (found by
the spec path on their command line) do not."""

from __future__ import annotations

import shlex
import subprocess
import sys
import time

import psutil
import pytest

from gpt2dist.errors import UsageError
from gpt2dist.system.conditions import QUIET_WAIT_ENV, LoadMonitor, quiet_wait_s, wait_for_quiet

BUSY = "import time\nend = time.time() + {seconds}\nwhile time.time() < end: pass"


def busy(seconds: float, *extra: str) -> list[str]:
    """A bounded busy loop: it ends by itself even if the test dies."""
    return [sys.executable, "-c", BUSY.format(seconds=seconds), *extra]


def detached(command: list[str]) -> psutil.Process:
    """Start `command` outside this process tree (setsid, and a shell that exits at once), as an unrelated
    process or a rank that srun started would be; returns it so the test can wait for it to end."""
    shell = subprocess.run(["setsid", "sh", "-c", shlex.join(command) + " > /dev/null 2>&1 & echo $!"],
                           capture_output=True, text=True, check=True)
    return psutil.Process(int(shell.stdout.strip()))


def monitored(start_work, seconds: float = 3.0, spec: str | None = None) -> dict:
    with LoadMonitor(spec, interval_s=0.5) as monitor:
        procs = start_work()
        time.sleep(seconds)
    gone, alive = psutil.wait_procs(procs, timeout=30)  # each ends by itself, before the next test measures
    assert not alive
    return monitor.summary()


@pytest.mark.slow  # seconds of a real busy process
@pytest.mark.timeout(60)
def test_another_process_busy_on_our_cpus_is_foreign(tmp_path):
    # Started outside our process tree (setsid + a shell that exits at once), as an unrelated hog is.
    def hog():
        return [detached(busy(3.5))]

    summary = monitored(hog)
    cpus = len(summary["cpus"])
    assert summary["foreign_cpu_share_mean"] > 0.6 / cpus, summary  # one busy CPU out of `cpus`
    assert len(summary["foreign_cpu_share"]) >= 4 and summary["load_avg_before"] is not None


@pytest.mark.slow  # seconds of the run's own busy processes
@pytest.mark.alone  # another test's processes are foreign
@pytest.mark.timeout(60)
def test_the_runs_own_processes_are_not_foreign(tmp_path):
    spec = str(tmp_path / "spec.json")

    def own_work():
        child = psutil.Popen(busy(3.5))  # a rank the launcher started
        # a rank srun would start: not our descendant, but it names the run's spec
        return [child, detached(busy(3.5, spec))]

    summary = monitored(own_work, spec=spec)
    assert summary["foreign_cpu_share_mean"] < 0.15, summary


def test_the_quiet_wait_is_bounded_by_its_setting(monkeypatch):
    """GPT2DIST_QUIET_WAIT_S caps the wait (0: none); anything but seconds >= 0 is one clear error."""
    monkeypatch.setenv(QUIET_WAIT_ENV, "0")
    hog = detached(busy(3))
    started = time.monotonic()
    assert wait_for_quiet() == 0.0 and time.monotonic() - started < 0.1
    monkeypatch.setenv(QUIET_WAIT_ENV, "1.5")
    assert 1.5 <= wait_for_quiet() < 2.5  # the hog keeps the machine busy past the cap
    psutil.wait_procs([hog], timeout=30)
    monkeypatch.delenv(QUIET_WAIT_ENV)
    assert quiet_wait_s() == 10.0
    for bad in ("soon", "-1", "inf", "nan"):
        monkeypatch.setenv(QUIET_WAIT_ENV, bad)
        with pytest.raises(UsageError, match=f"GPT2DIST_QUIET_WAIT_S must be seconds >= 0 .*got '{bad}'"):
            quiet_wait_s()
