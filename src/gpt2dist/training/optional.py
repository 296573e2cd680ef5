"""The optional dependencies (Horovod, NVIDIA Apex): import one, or stop with one line saying where to
get it (config.extras.EXTRAS). Light on purpose: the launching process checks them before any rank
starts, without loading the strategies that use them."""

from __future__ import annotations

import importlib
from types import ModuleType

from gpt2dist.config.extras import Extra, EXTRAS
from gpt2dist.errors import UsageError


def require(extra: Extra) -> ModuleType:
    try:
        return importlib.import_module(extra.module)
    except ImportError as exc:
        raise UsageError(f"{extra.name} is not importable here ({exc}); {extra.source}, or use {extra.instead}") \
            from None


def import_horovod() -> ModuleType:
    return require(EXTRAS["horovod.torch"])


def require_apex() -> ModuleType:
    """apex.amp, or a one-line error saying where to get it."""
    return require(EXTRAS["apex.amp"])


def require_apex_parallel() -> ModuleType:
    return require(EXTRAS["apex.parallel"])
