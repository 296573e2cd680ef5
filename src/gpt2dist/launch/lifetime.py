"""Ranks live no longer than their run: a stop signal sent to `gpt2dist train` reaches every rank, and
ranks exit within seconds when that process dies, SIGKILL included.

torchrun and horovodrun start ranks in sessions of their own, so neither a terminal's Ctrl-C nor the
death of `gpt2dist train` reaches them directly. Three links close the gap: the launcher forwards stop
signals to its child (torchrun and horovodrun pass SIGTERM on to their ranks); each rank beside the
launcher (same kernel, same PID namespace: this machine, or an emulated node on it) watches the
launcher's process itself; and the kernel ends the child when the launcher dies (PR_SET_PDEATHSIG).
That last signal is SIGKILL where every rank watches the launcher: the child's own shutdown adds
nothing then and was seen to stall (a torchrun agent alive 10 s after its ranks had exited, their
exits not collected). srun, which alone reaches ranks on other machines, gets SIGTERM and passes
it on.
"""

from __future__ import annotations

import collections
import contextlib
import gc
import logging
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

import psutil

from gpt2dist.errors import failure_line
from gpt2dist.system.parent_death import ends_with_this_process
from gpt2dist.training import stops

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# a rank blocked in a collective never runs Python signal handlers; after this long it exits hard
GRACE_S = 3.0
LAUNCHER_ENV = "GPT2DIST_LAUNCHER"  # process space:pid of the `gpt2dist train` process the ranks belong to
WATCH_INTERVAL_S = 0.2  # how often a rank checks that its launcher still runs
STDERR_KEPT = 256  # the last reads of each launcher's stderr, where a failure's first exception is looked for


def launcher_env() -> dict[str, str]:
    return {LAUNCHER_ENV: f"{_process_space()}:{os.getpid()}"}


def _death_signal(command: list[str]) -> signal.Signals:
    """What the kernel sends a launcher child when this process dies: SIGTERM to srun, which alone
    reaches ranks on other machines and passes it on; SIGKILL otherwise, as every rank watches this
    process itself."""
    return signal.SIGTERM if Path(command[0]).name == "srun" else signal.SIGKILL


def _process_space() -> str:
    """Where a pid means the same process: this kernel (its boot id) and this PID namespace. A hostname
    would not do: emulated nodes have their own, and containers may share one."""
    boot_id = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    return f"{boot_id}/{os.stat('/proc/self/ns/pid').st_ino}"


def run_launchers(commands: list[list[str]], env: dict[str, str]) -> tuple[int, int | None, str | None]:
    """Run launcher children (one, or one per node for torchrun) to their end; return the first non-zero
    exit code (or 0), the stop signal forwarded to them, if any, and for a failure the line of their (and their
    ranks') stderr that says what went wrong, for the run's record.

    Each child gets its own process group, so a terminal's Ctrl-C reaches it once, through this
    process. Their stderr (and their ranks') passes through here: once stopped, torchrun and horovodrun
    print a traceback of their own, which this process replaces with one line. When one child fails,
    the others get SIGTERM: they would wait for their lost peer until the rendezvous times out.
    """
    env = {**env, **launcher_env()}
    children = [subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                 preexec_fn=ends_with_this_process(_death_signal(command))) for command in commands]
    forwarded: list[int] = []
    tails: list[collections.deque] = [collections.deque(maxlen=STDERR_KEPT) for _ in children]
    relays = [threading.Thread(target=_relay_until_stopped, args=(child.stderr, forwarded, tail), daemon=True)
              for child, tail in zip(children, tails)]
    for relay in relays:
        relay.start()

    def forward(signum, frame):
        forwarded.append(signum)
        for child in children:
            if child.poll() is None:
                child.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in STOP_SIGNALS}
    try:
        code = _wait_all(children)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    for relay in relays:
        relay.join(timeout=GRACE_S)  # a rank that outlives its launcher may hold the pipe open
    said = b"".join(chunk for tail in tails for chunk in tail).decode(errors="replace")
    return code, (forwarded[0] if forwarded else None), failure_line(said) if code else None


def stop(process: subprocess.Popen, grace_s: float) -> None:
    """SIGTERM, then SIGKILL if it is still there after `grace_s`; returns once it is gone and reaped."""
    process.terminate()
    try:
        process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _wait_all(children: list[subprocess.Popen]) -> int:
    """Wait for every child; the first failure stops the rest."""
    code = 0
    running = list(children)
    while running:
        for child in list(running):
            if child.poll() is None:
                continue
            running.remove(child)
            if child.returncode and not code:
                code = child.returncode
                for other in running:
                    other.terminate()
        if running:
            time.sleep(0.05)  # a launch ends this much after its last child: a tenth of a second was lost per run
    return code


def _relay_until_stopped(source: IO[bytes], stopped: list[int], kept: collections.deque) -> None:
    line_open = False  # a progress bar's line, to end before the launcher's error line
    while chunk := os.read(source.fileno(), 1 << 16):
        kept.append(chunk)
        if not stopped:
            sys.stderr.buffer.write(chunk)
            sys.stderr.buffer.flush()
            line_open = not chunk.endswith(b"\n")
    if stopped and line_open:
        sys.stderr.buffer.write(b"\n")


def stop_on_signals() -> None:
    """Make stop signals raise Interrupted in the main thread, and end this process hard if the main
    thread does not finish within GRACE_S; a rank started by a launcher also stops when it dies."""
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write, warn_on_full_buffer=False)
    for sig in STOP_SIGNALS:
        signal.signal(sig, _ask_to_stop)
    threading.Thread(target=_watch, args=(wake_read, _launcher()), daemon=True, name="gpt2dist-watchdog").start()


@contextlib.contextmanager
def importing_without_collection():
    """Import torch and what a run loads without Python's cyclic collector, whose passes over the growing heap
    took 0.6 of the 3.2 CPU-seconds that importing torch and torch._dynamo takes on a 2-core EPYC; then freeze
    what they made, which later collections skip (and which a rank forked from this process does not copy by
    touching it: the gc module's own advice for a process that forks)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if enabled:
            gc.enable()


def exit_now(code: int) -> None:
    """End this process without interpreter shutdown, once what it writes is closed: unloading torch takes 0.6 s
    and 1.1 to 1.4 s once torch._dynamo is loaded too (which torch's optimizers load), measured on a 2-core EPYC,
    and every rank, run and pipeline job paid it; a stopped process could take seconds. Under a profiler or
    tracer (cProfile, coverage), which write their results at shutdown, it exits the usual way."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    if sys.getprofile() is None and sys.gettrace() is None:
        os._exit(code)
    sys.exit(code)


def run_then_exit_now(main: Callable[[], object]) -> None:
    """A command's entry point: main(), then exit_now with the code its SystemExit carries (0 where it returns).
    Any other exception ends the usual way, its traceback printed."""
    try:
        main()
    except SystemExit as end:
        if not isinstance(end.code, int | None):
            raise
        exit_now(end.code or 0)
    exit_now(0)


def _ask_to_stop(signum, frame) -> None:
    stops.ask(signum)


def _launcher() -> psutil.Process | None:
    """This rank's `gpt2dist train` process, when its pid means the same process here (psutil compares
    start times too, so a reused pid is not mistaken for it)."""
    space, _, pid = os.environ.get(LAUNCHER_ENV, "").rpartition(":")
    if space != _process_space() or not pid.isdigit():
        return None  # not started by `gpt2dist train`, or started on another machine by srun
    try:
        return psutil.Process(int(pid))
    except psutil.NoSuchProcess:
        os.kill(os.getpid(), signal.SIGTERM)  # the launcher is already gone
    return None


def _watch(wake_read: int, launcher: psutil.Process | None) -> None:
    """Wait for a stop signal or the launcher's end, then give the main thread GRACE_S to finish."""
    while True:
        ready, _, _ = select.select([wake_read], [], [], WATCH_INTERVAL_S if launcher else None)
        if launcher is not None and ended(launcher):
            signum = signal.SIGTERM
            os.kill(os.getpid(), signum)
            break
        signum = next((n for n in os.read(wake_read, 64) if n in STOP_SIGNALS), None) if ready else None
        if signum is not None:
            break
    time.sleep(GRACE_S)
    os._exit(128 + signum)  # no flush: the main thread may hold the stream's lock


def ended(process: psutil.Process) -> bool:
    """Whether `process` has exited; a zombie has, though its parent has not collected it yet."""
    try:
        return not process.is_running() or process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
