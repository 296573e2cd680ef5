"""The optional dependencies some engines and precisions need, and where to get each: preflight and doctor check
them before any rank starts (training.optional imports them)."""

from __future__ import annotations

from dataclasses import dataclass

from gpt2dist.config.units import APEX_PRECISIONS


@dataclass(frozen=True)
class Extra:
    """An optional dependency some strategies or precisions need, and where to get it."""

    module: str
    name: str
    source: str  # what to do to get it
    instead: str  # what runs without it


IMAGE = "run inside the gpt2dist container image (containers/), which builds it"
EXTRAS = {
    "horovod.torch": Extra("horovod.torch", "Horovod", "install it with containers/install_horovod.sh",
                           "--strategy ddp"),
    "apex.amp": Extra("apex.amp", "NVIDIA Apex (apex.amp)", IMAGE, "--precision fp16 for native AMP"),
    "apex.parallel": Extra("apex.parallel", "NVIDIA Apex (apex.parallel)", IMAGE, "--strategy ddp"),
}
PRECISION_EXTRAS = {precision: ("apex.amp",) for precision in APEX_PRECISIONS}
