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

from gpt2dist.config.schema import RunSpec
from gpt2dist.errors import UsageError
from gpt2dist.io import atomic_open

log = logging.getLogger(__name__)
CHECKPOINT_FORMAT = 2  # 2: metrics lines inside


def save_checkpoint(path: Path, *, step: int, spec: RunSpec, model: dict, optimizer: dict, optimizer_by_name: bool,
                    precision: dict, metrics: list[dict]) -> None:
    payload = {
        "format": CHECKPOINT_FORMAT,
        "fingerprint": spec.fingerprint(),
        # what another strategy's run needs to continue it (--resume-from)
        "computation": spec.computation_fingerprint(),
        "placement": {"strategy": spec.strategy, "nproc": spec.nproc},
        "optimizer_by_name": optimizer_by_name,  # else torch's positional form (Horovod, Apex amp)
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


def load_other_runs_checkpoint(path: Path, spec: RunSpec, optimizer_by_name: bool) -> dict:
    """Another run's checkpoint that this one continues (--resume-from): the same computation, saved under any
    strategy and process count, since every checkpoint holds single's layout. Refused, in one line, when it
    computes something else or keeps its optimizer state in a form this run cannot map to its parameters."""
    payload = torch.load(path, map_location="cpu", weights_only=False)
    if payload.get("format") != CHECKPOINT_FORMAT or "computation" not in payload:
        raise UsageError(f"--resume-from {path} was saved before checkpoints said what they compute; resume it under "
                         "its own strategy and process count, in its own directory")
    saved = payload["placement"]
    if payload["computation"] != spec.computation_fingerprint():
        raise UsageError(f"--resume-from {path} ({saved['strategy']}, {saved['nproc']} processes) computes something "
                         "else: its model, data, optimizer, precision or seed differ from this run's, beyond the "
                         "strategy and process count; continue it with its own settings")
    if payload["optimizer_by_name"] != optimizer_by_name:
        kept, wanted = ("by position", "by parameter name") if optimizer_by_name else ("by parameter name",
                                                                                   "by position")
        raise UsageError(f"--resume-from {path}: its {saved['strategy']} run keeps AdamW's state {kept}, this "
                         f"{spec.strategy} run {wanted} (Apex amp keeps it by position); continue it "
                         f"under {saved['strategy']} or with a strategy that keeps it {kept}")
    return payload
