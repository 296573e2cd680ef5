"""One writer per run directory, and one timed run per machine. flock locks belong to open files, so
the kernel drops them when their holder dies: a crash never leaves a stale lock behind.

The `gpt2dist train` process holds LAUNCHER_LOCK exclusively for the whole run; every rank holds
RANKS_LOCK shared. Before it starts ranks, a launcher must once take RANKS_LOCK exclusively, so ranks
that outlive a killed launcher keep a second run out of their directory until they are gone.

A launcher then waits for the machine lock: two runs sharing a node would each report the other's
load as their own speed. The workflow tools serialize a study's runs (each train job asks for every
core; Snakemake 9.10 to 9.16 did not, snakemake/snakemake#3913), but two studies, or a study and a run
by hand, can still meet on one machine. Selftests hold the lock shared: they measure nothing, so they
may overlap one another, never a timed run.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import socket
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from gpt2dist.errors import UsageError

LAUNCHER_LOCK = ".launcher.lock"
RANKS_LOCK = ".ranks.lock"
# ranks of a killed launcher stop within a few seconds (lifetime.GRACE_S after their watchdog fires)
SURVIVOR_WAIT_S = 15.0
# The machine lock's file: per user in the temporary directory unless this names another (a directory
# a container shares with its host, or a second file for runs meant to share a node on purpose).
MACHINE_LOCK_ENV = "GPT2DIST_MACHINE_LOCK"
# set while a process holds the machine: its children (the selftest's runs) are part of its work
MACHINE_HELD_ENV = "GPT2DIST_MACHINE_HELD"

log = logging.getLogger(__name__)


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
    if not ranks_gone(out, wait_s):
        raise UsageError(f"ranks of an earlier run still use {out} after {wait_s:.0f} s; stop them "
                         f"(`fuser -v {out / RANKS_LOCK}` lists them) and re-run")


def ranks_gone(out: Path, wait_s: float) -> bool:
    """Whether every rank working in `out` (hold_as_rank) has let go of it within `wait_s`. A launcher can end
    before its ranks do: horovodrun, stopped by a signal, exits while its ranks still write their report."""
    deadline = time.monotonic() + wait_s
    with open(out / RANKS_LOCK, "a") as handle:
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return True  # closing the file lets ranks take it shared again
            except BlockingIOError:
                if time.monotonic() > deadline:
                    return False
                time.sleep(0.05)


def hold_as_rank(out: Path) -> IO:
    """Mark this rank as working in `out` until the returned file is closed (or the process ends)."""
    handle = open(out / RANKS_LOCK, "a+")  # readable: NFSv4 refuses a shared lock on a write-only file
    try:
        fcntl.flock(handle, fcntl.LOCK_SH)
    except OSError as exc:
        handle.close()
        raise UsageError(f"cannot lock {out / RANKS_LOCK} ({exc.strerror}): --out must be on a file system with "
                         "flock (Lustre: mount with -o flock)") from None
    return handle


def machine_lock_path() -> Path:
    default = Path(tempfile.gettempdir()) / f"gpt2dist-{os.getuid()}.machine.lock"
    return Path(os.environ.get(MACHINE_LOCK_ENV) or default)


def held_by_parent() -> bool:
    """Whether this process runs inside another's hold on the machine (a selftest's check): part of
    that process's work, not a measurement of its own."""
    return bool(os.environ.get(MACHINE_HELD_ENV))


@contextlib.contextmanager
def hold_the_machine(poll_s: float = 0.5, *, shared: bool = False) -> Iterator[None]:
    """Wait until no other gpt2dist run uses this machine, then keep others waiting until done.

    `shared`: for work that measures nothing (selftests): such holders may overlap one another, never a
    timed run."""
    if held_by_parent():
        yield  # a parent holds it for us
        return
    path = machine_lock_path()
    with open(path, "a+") as handle:
        told = False
        while True:
            try:
                fcntl.flock(handle, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not told:
                    handle.seek(0)
                    log.warning("waiting for the machine: another gpt2dist run holds %s (%s)", path,
                                handle.read().strip() or "starting")
                    told = True
                time.sleep(poll_s)
        handle.truncate(0)
        holder = f"pid {os.getpid()}" + (" (a selftest)" if shared else "")
        handle.write(f"{holder} since {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
        handle.flush()
        os.environ[MACHINE_HELD_ENV] = str(os.getpid())
        try:
            yield
        finally:
            del os.environ[MACHINE_HELD_ENV]
