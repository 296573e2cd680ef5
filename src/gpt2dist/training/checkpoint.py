"""Resumable checkpoints: model, optimizer, precision state (loss scaler; Apex O2's fp32
master weights) and data position in one file. The model is keyed by parameter name; the
optimizer too, except where the strategy or precision keeps torch's positional form
(Strategy.full_state_dict).

The file is replaced atomically, so a run killed mid-write resumes from the previous
checkpoint. Randomness needs no saved generator state: data order and dropout are seeded
from (seed, step, rank) at every step, so a resumed run draws exactly what an
uninterrupted one would, even at another world size.
"""

from __future__ import annotations

from pathlib import Path

import torch

from gpt2dist.errors import UsageError
from gpt2dist.io import atomic_open

CHECKPOINT_FORMAT = 1


def save_checkpoint(path: Path, *, step: int, fingerprint: str, model: dict, optimizer: dict, precision: dict) -> None:
    payload = {
        "format": CHECKPOINT_FORMAT,
        "fingerprint": fingerprint,
        "step": step,  # optimizer steps completed == position in the step-indexed data stream
        "model": model,
        "optimizer": optimizer,
        "precision": precision,
    }
    with atomic_open(path, "wb") as handle:
        torch.save(payload, handle)


def load_checkpoint(path: Path, fingerprint: str) -> dict | None:
    """The checkpoint to resume from, None when there is none; refuses another run's."""
    if not path.exists():
        return None
    payload = torch.load(path, map_location="cpu", weights_only=False)
    if payload.get("format") != CHECKPOINT_FORMAT or payload.get("fingerprint") != fingerprint:
        raise UsageError(
            f"{path} belongs to a run with other settings (fingerprint {payload.get('fingerprint')}, "
            f"this run {fingerprint}); use another --out or delete that directory"
        )
    return payload
