"""The optional dependencies (Horovod, NVIDIA Apex): import one, or stop with one line saying where to
get it. Light on purpose: the launching process checks them before any rank starts, without loading
the strategies that use them."""

from __future__ import annotations

import importlib
from types import ModuleType

from gpt2dist.errors import UsageError


def import_horovod() -> ModuleType:
    try:
        import horovod.torch as hvd
    except ImportError as exc:
        raise UsageError(
            f"horovod is not importable ({exc}); install it with containers/install_horovod.sh"
        ) from None
    return hvd


def require_apex() -> ModuleType:
    """apex.amp, or a one-line error saying where to get it."""
    try:
        return importlib.import_module("apex.amp")
    except ImportError:
        raise UsageError(
            "NVIDIA Apex (apex.amp) is not importable here; run inside the gpt2dist container image "
            "(containers/), which builds it, or use --precision fp16 for native AMP"
        ) from None


def require_apex_parallel() -> ModuleType:
    try:
        return importlib.import_module("apex.parallel")
    except ImportError:
        raise UsageError(
            "NVIDIA Apex (apex.parallel) is not importable here; run inside the gpt2dist container image "
            "(containers/), which builds it, or use --strategy ddp"
        ) from None
