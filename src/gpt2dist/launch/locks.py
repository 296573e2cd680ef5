"""One writer per run directory. flock locks belong to open files, so the kernel drops them when their
holder dies: a crash never leaves a stale lock behind.

The `gpt2dist train` process holds LAUNCHER_LOCK exclusively for the whole run; every rank holds
RANKS_LOCK shared. Before it starts ranks, a launcher must once take RANKS_LOCK exclusively, so ranks
that outlive a killed launcher keep a second run out of their directory until they are gone.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from gpt2dist.errors import UsageError

LAUNCHER_LOCK = ".launcher.lock"
RANKS_LOCK = ".ranks.lock"
# ranks of a killed launcher stop within a few seconds (lifetime.GRACE_S after their watchdog fires)
SURVIVOR_WAIT_S = 15.0


@contextlib.contextmanager
def own_run_directory(out: Path, survivor_wait_s: float = SURVIVOR_WAIT_S) -> Iterator[None]:
    """Hold `out` for one launcher; refuse at once if another launcher holds it."""
    out.mkdir(parents=True, exist_ok=True)
    with open(out / LAUNCHER_LOCK, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "a process that just started"
            raise UsageError(f"{out} is in use by another gpt2dist train ({holder}); wait for it to end, stop it, "
                             "or choose another --out") from None
        handle.truncate(0)
        handle.write(f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
        handle.flush()
        _wait_for_survivors(out, survivor_wait_s)
        yield


def _wait_for_survivors(out: Path, wait_s: float) -> None:
    deadline = time.monotonic() + wait_s
    with open(out / RANKS_LOCK, "a") as handle:
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return  # closing the file lets this run's ranks take it shared
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise UsageError(f"ranks of an earlier run still use {out} after {wait_s:.0f} s; stop them "
                                     f"(`fuser -v {out / RANKS_LOCK}` lists them) and re-run") from None
                time.sleep(0.1)


def hold_as_rank(out: Path) -> IO:
    """Mark this rank as working in `out` until the returned file is closed (or the process ends)."""
    handle = open(out / RANKS_LOCK, "a")
    fcntl.flock(handle, fcntl.LOCK_SH)
    return handle
