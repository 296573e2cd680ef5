"""Per-step metrics (metrics.jsonl) and the run record (run.json), written by rank 0 only.

`step` in every line counts the optimizer updates applied to the weights that produced
the measurement: a train line's loss at step k comes from weights after k updates, an
eval line at step k evaluates weights after k updates.
"""

from __future__ import annotations

import json
import resource
from datetime import datetime, timezone
from pathlib import Path

import torch

from gpt2dist.io import atomic_write_text


def peak_memory_bytes(device: torch.device) -> int:
    """Peak allocated CUDA memory, or this process's peak resident set on CPU."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux reports KiB


class MetricsLog:
    """Append-only JSONL; on resume, lines measured after the checkpoint are dropped first."""

    def __init__(self, path: Path, *, enabled: bool, resume_step: int):
        self.path, self.enabled = path, enabled
        self._handle = None
        if not enabled:
            return
        kept = []
        if resume_step and path.exists():
            for line in path.read_text().splitlines():
                record = json.loads(line)
                if record["step"] < resume_step or (record["kind"] == "eval" and record["step"] == resume_step):
                    kept.append(line + "\n")
        atomic_write_text(path, "".join(kept))
        self._handle = open(path, "a", buffering=1)

    def write(self, record: dict) -> None:
        if self._handle:
            self._handle.write(json.dumps(record) + "\n")

    def close(self) -> None:
        if self._handle:
            self._handle.close()


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")
