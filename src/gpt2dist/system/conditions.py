"""The conditions a run was measured in: how busy the machine was with work that is not the run.

A throughput number is only as good as the machine was quiet. Other processes competing for
the run's CPUs (or a hypervisor stealing them) slow some runs and not others, and a summary
that averages them in turns noise into conclusions. `LoadMonitor` samples, once a second,
how much of the run's CPUs was busy with anything but the run itself; collect flags runs
where that share was high.

"The run itself" is this process, its descendants, and any process whose command line names
the run's spec file (ranks started by srun are children of slurmd, not of the launcher).
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import psutil

from gpt2dist.errors import UsageError

BUSY_FIELDS = ("user", "nice", "system", "irq", "softirq", "steal", "guest", "guest_nice")


def run_cpus() -> list[int]:
    return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))


def _busy_seconds(cpus: list[int]) -> tuple[float, float]:
    """CPU seconds spent busy (anything but idle and iowait) and stolen, summed over `cpus`."""
    per_cpu = psutil.cpu_times(percpu=True)
    busy = steal = 0.0
    for index in cpus:
        if index < len(per_cpu):
            times = per_cpu[index]._asdict()
            # guest time is also counted in user on Linux; leave it out so it is not counted twice
            busy += sum(times.get(field, 0.0) for field in BUSY_FIELDS if not field.startswith("guest"))
            steal += times.get("steal", 0.0)
    return busy, steal


QUIET_WAIT_ENV = "GPT2DIST_QUIET_WAIT_S"  # the longest wait for a quiet machine; 0: start at once
QUIET_WAIT_DEFAULT_S = 10.0


def quiet_wait_s() -> float:
    text = os.environ.get(QUIET_WAIT_ENV, "")
    try:
        seconds = float(text) if text else QUIET_WAIT_DEFAULT_S
    except ValueError:
        seconds = -1.0
    if not 0 <= seconds < float("inf"):
        raise UsageError(f"{QUIET_WAIT_ENV} must be seconds >= 0 (0: do not wait), got '{text}'")
    return seconds


def wait_for_quiet(limit: float = 0.05, interval_s: float = 0.5) -> float:
    """Wait until other processes use at most `limit` of this process's CPUs over one interval, or
    quiet_wait_s() passed; returns the seconds waited. A workflow tool's bookkeeping after the previous
    job (a second or more for Snakemake with a large study) otherwise shares the first steps of a short
    run; a run that still starts on a busy machine is flagged by collect as before."""
    timeout_s = quiet_wait_s()
    if timeout_s == 0:
        return 0.0
    cpus, me, started = run_cpus(), psutil.Process(), time.monotonic()

    def own() -> float:
        times = me.cpu_times()
        return times.user + times.system

    while True:
        busy, mine, wall = _busy_seconds(cpus)[0], own(), time.monotonic()
        time.sleep(interval_s)
        foreign = (_busy_seconds(cpus)[0] - busy) - (own() - mine)
        waited = time.monotonic() - started
        if foreign <= limit * (time.monotonic() - wall) * len(cpus) or waited >= timeout_s:
            return waited


class LoadMonitor:
    """Samples the share of the run's CPUs used by other work while the run trains.

    Use as a context manager around the launch; `summary()` afterwards is what run.json records.
    Each sample is (busy seconds on the run's CPUs - CPU seconds of the run's processes) /
    (interval x number of CPUs), clipped to [0, 1].
    """

    def __init__(self, spec_path: Path | None = None, interval_s: float = 1.0):
        """spec_path: the run's processes include those whose command line names it (ranks started outside this
        process's family: srun's tasks, horovodrun's); None where the run trains in this process. Looking for
        them reads every process's command line each sample, Python work that holds the interpreter lock for
        milliseconds, which a run training in this process would wait for in its steps."""
        self.spec_path = str(spec_path) if spec_path else None
        self.interval_s = interval_s
        self.cpus = run_cpus()
        self.samples: list[float] = []
        self.sample_ends: list[float] = []  # unix time at the end of each sample's interval
        self.steal: list[float] = []
        self.load_before = self.load_after = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample_loop, name="gpt2dist-load-monitor", daemon=True)

    def _own_processes(self) -> list[psutil.Process]:
        me = psutil.Process()
        family = {me.pid: me, **{child.pid: child for child in me.children(recursive=True)}}
        if self.spec_path:
            for proc in psutil.process_iter(["cmdline"]):
                if proc.pid not in family and self.spec_path in " ".join(proc.info["cmdline"] or ()):
                    family[proc.pid] = proc
        return list(family.values())

    def _own_cpu_seconds(self) -> float:
        """CPU seconds of the run's processes so far. A process's reaped children count in its own
        `children_*` times, so ranks that exited between two samples are not mistaken for others' work."""
        total = 0.0
        for proc in self._own_processes():
            try:
                times = proc.cpu_times()
            except psutil.Error:
                continue
            total += times.user + times.system + times.children_user + times.children_system
        return total

    def _sample_loop(self) -> None:
        busy, steal = _busy_seconds(self.cpus)
        own, wall = self._own_cpu_seconds(), time.monotonic()
        while not self._stop.wait(self.interval_s):
            busy_now, steal_now = _busy_seconds(self.cpus)
            own_now, wall_now = self._own_cpu_seconds(), time.monotonic()
            capacity = (wall_now - wall) * len(self.cpus)
            if capacity > 0:
                foreign = (busy_now - busy) - (own_now - own)
                self.samples.append(min(1.0, max(0.0, foreign / capacity)))
                self.sample_ends.append(time.time())
                self.steal.append(min(1.0, max(0.0, (steal_now - steal) / capacity)))
            busy, steal, own, wall = busy_now, steal_now, own_now, wall_now

    def __enter__(self) -> LoadMonitor:
        self.load_before = list(os.getloadavg())
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.load_after = list(os.getloadavg())

    def summary(self) -> dict:
        samples = self.samples
        return {
            "cpus": self.cpus,
            "load_avg_before": self.load_before,
            "load_avg_after": self.load_after,
            "interval_s": self.interval_s,
            "foreign_cpu_share_mean": sum(samples) / len(samples) if samples else None,
            "foreign_cpu_share_max": max(samples) if samples else None,
            "steal_share_mean": sum(self.steal) / len(self.steal) if self.steal else None,
            "foreign_cpu_share": [round(s, 3) for s in samples],
            "sample_ends_unix_s": [round(t, 2) for t in self.sample_ends],
        }
