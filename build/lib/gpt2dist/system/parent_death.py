"""Children that end with the process that started them, SIGKILL of that process included: the kernel
sends them a signal when it dies (PR_SET_PDEATHSIG), since no clean-up code runs then."""

from __future__ import annotations

import ctypes
import os
import signal
from collections.abc import Callable

_PR_SET_PDEATHSIG = 1


def ends_with_this_process(death_signal: signal.Signals) -> Callable[[], None]:
    """preexec_fn for a child: a process group of its own (a terminal's Ctrl-C reaches it only through
    this process), and `death_signal` when this process dies, checked once after arming since this
    process may die between fork and prctl."""
    parent = os.getpid()
    prctl = ctypes.CDLL(None, use_errno=True).prctl

    def arm() -> None:
        os.setpgid(0, 0)
        prctl(_PR_SET_PDEATHSIG, int(death_signal))
        if os.getppid() != parent:
            os._exit(128 + death_signal)

    return arm
