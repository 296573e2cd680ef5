"""Resumable checkpoints: model, optimizer, precision state (loss scaler; Apex O2's fp32
master weights) and data position in one file. The model is keyed by parameter name; the
optimizer too, except where the strategy or precision keeps torch's positional form
(Strategy.full_state_dict). The metrics lines written so far travel with it, so a workflow
tool that deletes an interrupted job's declared outputs (Snakemake's --rerun-incomplete, DVC
before every run) loses nothing a resumed run needs.

The file is replaced atomically, so a run killed mid-write resumes from the previous
checkpoint. Randomness needs no saved generator state: data order and dropout are seeded
from (seed, step, rank) at every step, so a resumed run draws exactly what an
uninterrupted one would, even at another world size.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from gpt2dist.errors import UsageError
from gpt2dist.io import atomic_open

log = logging.getLogger(__name__)
CHECKPOINT_FORMAT = 2  # 2: metrics lines inside


def save_checkpoint(path: Path, *, step: int, fingerprint: str, model: dict, optimizer: dict, precision: dict,
                    metrics: list[dict]) -> None:
    payload = {
        "format": CHECKPOINT_FORMAT,
        "fingerprint": fingerprint,
        "step": step,  # optimizer steps completed == position in the step-indexed data stream
        "model": model,
        "optimizer": optimizer,
        "precision": precision,
        "metrics": metrics,  # metrics.jsonl's records up to this step
    }
    with atomic_open(path, "wb") as handle:
        torch.save(payload, handle)


def load_checkpoint(path: Path, fingerprint: str, *, stale: str = "fail") -> dict | None:
    """The checkpoint to resume from, None when there is none. Another run's checkpoint is refused
    (stale="fail", by hand: the directory holds someone else's run), or ignored so training starts
    afresh (stale="restart": a workflow tool re-runs a job because its settings changed). Every rank
    reads the file and none deletes it (another rank may still be reading): the run's first checkpoint
    replaces it."""
    if not path.exists():
        return None
    payload = torch.load(path, map_location="cpu", weights_only=False)
    if payload.get("format") == CHECKPOINT_FORMAT and payload.get("fingerprint") == fingerprint:
        return payload
    if stale == "restart":
        log.warning("%s is from other settings (fingerprint %s); starting afresh", path, payload.get("fingerprint"))
        return None
    raise UsageError(
        f"{path} belongs to a run with other settings (fingerprint {payload.get('fingerprint')}, "
        f"this run {fingerprint}); use another --out or delete that directory"
    )
