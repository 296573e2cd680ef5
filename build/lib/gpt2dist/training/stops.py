"""Where a stop signal may interrupt training: anywhere but inside `deferred()`, which keeps a checkpoint
and the run record naming it together (a stop between the two left run.json naming an older step
than the checkpoint a re-run resumes from). The signal handler (launch.lifetime) asks `postpone`;
a postponed stop is raised when the section ends. A section that hangs is still cut: a stopped
rank's watchdog ends the process after its grace time, and atomic writes leave the older pair."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from gpt2dist.errors import Interrupted

_open_sections = 0
_postponed: list[int] = []


def postpone(signum: int) -> bool:
    """Keep a stop signal for the end of the current section; False outside one (stop now)."""
    if _open_sections:
        _postponed.append(signum)
    return bool(_open_sections)


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    global _open_sections
    _open_sections += 1
    try:
        yield
    finally:
        _open_sections -= 1
    if not _open_sections and _postponed:
        raise Interrupted(_postponed[0])
