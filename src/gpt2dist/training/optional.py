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
    return _apex("amp", "--precision fp16 for native AMP")


def require_apex_parallel() -> ModuleType:
    return _apex("parallel", "--strategy ddp")


def _apex(part: str, instead: str) -> ModuleType:
    try:
        return importlib.import_module(f"apex.{part}")
    except ImportError:
        raise UsageError(
            f"NVIDIA Apex (apex.{part}) is not importable here; run inside the gpt2dist container image "
            f"(containers/), which builds it, or use {instead}"
        ) from None
