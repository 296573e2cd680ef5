"""Where a step's time goes, from torch.profiler traces of a run's last few steps: compute,
communication hidden under compute, exposed communication, data loading, and idle time (host
overhead, waiting outside a collective). The five parts partition the step's wall time, so a
strategy that is slower says why: more exposed communication, more idle, or more compute. A
pipeline's bubble is a stage waiting in its receive for its neighbour, so it counts as exposed
communication: the trace cannot tell waiting for bytes from moving them.

Which trace events count as what:
- compute: on CUDA, every kernel, copy and memset but NCCL's; on CPU, the operators the ranks'
  own threads run, leaving out collectives, the operators that build a batch and those inside a
  marked wait.
- communication: on CUDA, NCCL's kernels; on CPU, gloo's collectives (its worker threads
  annotate each); on both, the spans the strategies mark as waiting for a collective outside
  torch (Horovod's background thread is not traced, so its overlap with compute is not seen: its
  hidden part reads 0 and its waits count as exposed).
- data: building the next batch on the host, where nothing else runs.
Collectives issued through torch.distributed are also counted with their payload bytes, beside the
traffic model's estimate of what the strategy sends (config/traffic.py).

Every rank keeps its last traced step as a Chrome trace (the profiler's export, cut to that step's window,
gzipped), which Perfetto, chrome://tracing and Holistic Trace Analysis open: the ledger's numbers, and what is
behind them.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import math
import os
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from gpt2dist.io import atomic_open

STEP, DATA, COMM_WAIT = "gpt2dist.step", "gpt2dist.data", "gpt2dist.comm_wait"
KEPT = "gpt2dist"  # a kept trace's own key: the rank and step it holds (Horovod's ranks have no distributedInfo)
PARTS = ("compute_s", "comm_hidden_s", "comm_exposed_s", "data_s", "idle_s")
ELEMENT_BYTES = {"float": 4, "c10::BFloat16": 2, "c10::Half": 2, "double": 8, "long int": 8, "int": 4}
COLLECTIVE_PREFIXES = ("c10d::", "_c10d_functional::")

Interval = tuple[float, float]


def comm_wait():
    """Marks a span the host spends waiting for a collective the profiler cannot see (Horovod's)."""
    return record_function(COMM_WAIT)


def building_batch():
    return record_function(DATA)


class StepClock:
    """A step's wall and CPU time, read just before its trace span opens and just before it closes.

    The span's enter and exit are C++ calls that let go of the interpreter lock; where another thread of
    the process (the load monitor, the launcher watch) takes it meanwhile, this thread waits after the
    span's timestamp: a clock read inside the span would leave that wait out of step_time_s and in the
    ledger's window (up to 43 ms a step measured beside a busy thread). Read before each timestamp, the wait
    falls inside both intervals or outside both. The clock is read again just after each timestamp, so the
    span's window in the trace is known to lie within `window_bounds_s`, however long the enter or exit took
    (the scheduler can stop the thread between a read and its timestamp for a time slice or more, on a busy
    machine): tests/training/test_ledger.py holds the ledger to those bounds."""

    def __init__(self):
        self.cpu_started, self.started = time.process_time(), time.perf_counter()
        self.entered = self.stopped = self.exited = math.nan
        self.wall_s = self.cpu_s = math.nan

    def stop(self) -> None:
        self.cpu_s = time.process_time() - self.cpu_started
        self.stopped = time.perf_counter()
        self.wall_s = self.stopped - self.started

    @property
    def window_bounds_s(self) -> tuple[float, float]:
        """The shortest and the longest the span's window in the trace can be: its timestamps lie between the
        reads before and after its enter, and before and after its exit. step_time_s lies between them too."""
        return self.stopped - self.entered, self.exited - self.started


@contextlib.contextmanager
def timed_step() -> Iterator[StepClock]:
    """The step's span in the trace, and its clock (StepClock says where it is read)."""
    span = record_function(STEP)  # made before the clock starts: only its enter lies between the two
    clock = StepClock()
    with span:
        clock.entered = time.perf_counter()
        yield clock
        clock.stop()
    clock.exited = time.perf_counter()


class StepTracer:
    """Traces `steps` of a run with torch.profiler (every rank, so the traced steps slow all alike);
    rank 0 turns the trace into the ledger."""

    def __init__(self, steps: range, device: torch.device, list_element_bytes: int):
        self.steps, self.device, self.list_element_bytes = steps, device, list_element_bytes
        # kineto reads its level when the first profiler starts: without this, every traced step of every rank
        # logs its own profiler_start/profiler_stop lines between the loss lines (a user's setting is kept)
        os.environ.setdefault("KINETO_LOG_LEVEL", "6")
        self.profiler: profile | None = None

    @contextlib.contextmanager
    def step(self, step: int) -> Iterator[None]:
        if step not in self.steps:
            yield
            return
        if self.profiler is None:  # a resumed run starts inside the range: it traces the steps left
            activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.device.type == "cuda" else [])
            self.profiler = profile(activities=activities, record_shapes=True)  # shapes give collectives' bytes
            self.profiler.start()
        yield

    @property
    def kept_step(self) -> int:
        """The step whose trace every rank keeps: the last traced one."""
        return self.steps[-1]

    def finished(self, step: int) -> bool:
        return self.profiler is not None and step == self.kept_step

    def ledger(self, summarise: bool, keep: Path, rank: int) -> dict | None:
        """Stop tracing and keep the last traced step's trace at `keep` (every rank); the ledger of the traced
        steps when `summarise` (rank 0), else None."""
        self.profiler.stop()
        trace = exported(self.profiler)
        keep_last_step({**trace, KEPT: {"rank": rank, "step": self.kept_step}}, keep)
        events = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
        return summarise_trace(events, self.device.type == "cuda", self.list_element_bytes) if summarise else None


def exported(profiler: profile) -> dict:
    """A stopped profiler's Chrome trace, as the profiler exports it."""
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "trace.json"
        profiler.export_chrome_trace(str(path))
        return json.loads(path.read_text())


def profile_ledger(profiler: profile, cuda: bool, list_element_bytes: int = 4) -> dict:
    """The ledger of a stopped profiler's steps (those the trainer marked with timed_step)."""
    return summarise_trace([e for e in exported(profiler)["traceEvents"] if e.get("ph") == "X"], cuda,
                           list_element_bytes)


def keep_last_step(trace: dict, path: Path) -> None:
    """Write `trace` cut to its last step's window, gzipped: the events that overlap it and those without a time
    (process and thread names). One step is what a reader opens; every step of a run would be megabytes."""
    start, end = union(span(e) for e in trace["traceEvents"] if e.get("ph") == "X" and e["name"] == STEP)[-1]
    kept = [e for e in trace["traceEvents"]
            if "ts" not in e or (float(e["ts"]) <= end and float(e["ts"]) + float(e.get("dur", 0)) >= start)]
    # zlib's default level: level 9 took 4x its CPU time (0.06 s against 0.015) for a file 9% smaller (one step of
    # the tiny test model)
    with atomic_open(path, "wb") as handle, gzip.GzipFile(filename="", mode="wb", fileobj=handle, mtime=0,
                                                          compresslevel=6) as packed:
        packed.write(json.dumps({**trace, "traceEvents": kept}, separators=(",", ":")).encode())


def read_trace(path: Path) -> dict:
    """A kept trace (keep_last_step's file)."""
    with gzip.open(path, "rt") as handle:
        return json.load(handle)


def summarise_trace(events: list[dict], cuda: bool, list_element_bytes: int = 4) -> dict:
    """The mean ledger (seconds per step) of the traced steps, and their collectives per step."""
    windows = union(span(e) for e in events if e["name"] == STEP)
    data = union(span(e) for e in events if e["name"] == DATA)
    waits = [span(e) for e in events if e["name"] == COMM_WAIT]
    if cuda:
        device_work = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
        comm = union([span(e) for e in device_work if e["name"].lower().startswith("nccl")] + waits)
        compute = union(span(e) for e in device_work if not e["name"].lower().startswith("nccl"))
    else:
        comm = union([span(e) for e in events if e.get("cat") == "user_annotation" and e["name"].startswith("gloo:")]
                     + waits)
        ops = [span(e) for e in events if e.get("cat") == "cpu_op" and not is_communication(e["name"])]
        compute = subtract(subtract(union(ops), data), union(waits))  # what runs inside a wait is the collective's
    per_step = []
    for window in windows:
        k, c, d = (clip(intervals, window) for intervals in (compute, comm, data))
        hidden = length(intersect(k, c))
        parts = {"compute_s": length(k) - hidden, "comm_hidden_s": hidden, "comm_exposed_s": length(subtract(c, k)),
                 "data_s": length(subtract(subtract(d, k), c)),
                 "idle_s": (window[1] - window[0]) - length(union(k + c + d))}
        per_step.append({name: parts[name] / 1e6 for name in PARTS})  # trace times are microseconds
    steps = max(1, len(windows))
    ledger = {name: sum(step[name] for step in per_step) / steps for name in PARTS}
    ledger["traced_steps"] = len(windows)
    ledger["per_step"] = per_step  # in the order they ran: the last is the step whose trace each rank keeps
    ledger["collectives"] = collectives(events, windows, steps, list_element_bytes)
    return ledger


def collectives(events: list[dict], windows: list[Interval], steps: int, list_element_bytes: int) -> dict:
    """Calls and payload bytes per step of each torch.distributed collective issued in the windows."""
    found: dict[str, dict] = {}
    for e in events:
        if e.get("cat") != "cpu_op" or not e["name"].startswith(COLLECTIVE_PREFIXES):
            continue
        if not any(start <= e["ts"] < end for start, end in windows):
            continue
        entry = found.setdefault(e["name"].split("::", 1)[1], {"calls": 0, "bytes": 0})
        entry["calls"] += 1
        entry["bytes"] += payload_bytes(e.get("args") or {}, list_element_bytes)
    return {name: {"calls": v["calls"] / steps, "bytes": v["bytes"] / steps} for name, v in sorted(found.items())}


def payload_bytes(args: dict, list_element_bytes: int) -> int:
    """Bytes of a collective's first (input) argument: a tensor, or a list of them (whose dtype the
    trace does not give: the strategy's gradient element size)."""
    dims, kinds = args.get("Input Dims") or [], args.get("Input type") or []
    if not dims:
        return 0
    shapes = dims[0] if kinds and kinds[0] == "TensorList" else [dims[0]]
    size = list_element_bytes if kinds and kinds[0] == "TensorList" else ELEMENT_BYTES.get(kinds[0] if kinds else "", 4)
    return sum(math.prod(shape) for shape in shapes) * size


def is_communication(name: str) -> bool:
    lowered = name.lower()
    return name.startswith(COLLECTIVE_PREFIXES) or any(word in lowered for word in ("gloo", "nccl", "wait"))


# -- interval arithmetic on sorted, disjoint [start, end) lists (written here: a few lines, no library needed)

def span(event: dict) -> Interval:
    return event["ts"], event["ts"] + event.get("dur", 0)


def union(intervals: Iterable[Interval]) -> list[Interval]:
    merged: list[list[float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        elif end > start:
            merged.append([start, end])
    return [(start, end) for start, end in merged]


def clip(intervals: list[Interval], window: Interval) -> list[Interval]:
    return [(max(s, window[0]), min(e, window[1])) for s, e in intervals if e > window[0] and s < window[1]]


def intersect(a: list[Interval], b: list[Interval]) -> list[Interval]:
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        start, end = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if start < end:
            out.append((start, end))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def subtract(a: list[Interval], b: list[Interval]) -> list[Interval]:
    out, first = [], 0
    for start, end in a:
        while first < len(b) and b[first][1] <= start:  # both sorted: cuts behind this interval stay behind
            first += 1
        cut = first
        while cut < len(b) and b[cut][0] < end:
            if b[cut][0] > start:
                out.append((start, b[cut][0]))
            start = max(start, b[cut][1])
            cut += 1
        if start < end:
            out.append((start, end))
    return out


def length(intervals: list[Interval]) -> float:
    return sum(end - start for start, end in intervals)
