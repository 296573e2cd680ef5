"""The machine lock between real processes: timed runs one at a time; selftests, which measure nothing,
together, but never beside a timed run."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

HOLD = ("import sys, time\nfrom gpt2dist.launch.locks import hold_the_machine\n"
        "with hold_the_machine(poll_s=0.05, shared=sys.argv[1] == 'shared'):\n"
        "    print('held', flush=True)\n    sys.stdin.readline()\n")


def holder(kind: str, lock) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", HOLD, kind], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True,
                            env={**os.environ, "GPT2DIST_MACHINE_LOCK": str(lock), "GPT2DIST_MACHINE_HELD": ""})


def holds_within(proc: subprocess.Popen, seconds: float) -> bool:
    os.set_blocking(proc.stdout.fileno(), False)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.stdout.readline() == "held\n":
            return True
        time.sleep(0.05)
    return False


def release(*procs: subprocess.Popen) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.stdin.write("\n")
            proc.stdin.flush()
        proc.wait(timeout=30)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("first, second, together", [
    ("shared", "shared", True),  # two selftests overlap
    ("shared", "exclusive", False),  # a timed run waits for a selftest
    ("exclusive", "shared", False),  # and a selftest for a timed run
    ("exclusive", "exclusive", False),  # timed runs one at a time
])
def test_the_machine_lock(tmp_path, first, second, together):
    lock = tmp_path / "machine.lock"
    a = holder(first, lock)
    b = None
    try:
        assert holds_within(a, 30)
        b = holder(second, lock)
        assert holds_within(b, 3 if not together else 30) is together
        if not together:
            release(a)
            assert holds_within(b, 30)
    finally:
        release(*(proc for proc in (a, b) if proc is not None))
