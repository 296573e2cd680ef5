"""Where a stop signal may interrupt training: anywhere but inside `deferred()`, which keeps a checkpoint
and the run record naming it together (a stop between the two left run.json naming an older step
than the checkpoint a re-run resumes from). The signal handler (launch.lifetime) calls `ask`; a stop
asked inside a section is raised when the section ends. A section that hangs is still cut: a stopped
rank's watchdog ends the process after its grace time, and atomic writes leave the older pair.

A stop is raised once per process (a second signal must not break the first one's clean-up), and
Python drops an exception raised where its handler happened to run inside a finalizer (`__del__`, a
weakref callback): `check()` at each step raises a stop that was asked but got lost that way."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from gpt2dist.errors import Interrupted

asked: int | None = None  # the first stop signal this process got
_open_sections = 0


def ask(signum: int) -> None:
    """Note a stop signal; raise it now unless a section defers it or an earlier one was noted."""
    global asked
    if asked is None:
        asked = signum
        if not _open_sections:
            raise Interrupted(signum)


def check() -> None:
    """Raise the stop asked earlier, outside any section: one whose exception was lost."""
    if asked is not None and not _open_sections:
        raise Interrupted(asked)


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    global _open_sections
    _open_sections += 1
    try:
        yield
    finally:
        _open_sections -= 1
    check()
