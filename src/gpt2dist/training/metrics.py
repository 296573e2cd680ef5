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
    """Append-only JSONL that remembers what it wrote, so a checkpoint can carry it. A resumed run
    starts the file from the checkpoint's history: lines measured after the checkpoint are dropped,
    and lines a workflow tool deleted with the file come back."""

    def __init__(self, path: Path, *, enabled: bool, history: list[dict]):
        self.path, self.enabled = path, enabled
        self.history = list(history)
        self._handle = None
        if not enabled:
            return
        atomic_write_text(path, "".join(json.dumps(record) + "\n" for record in self.history))
        self._handle = open(path, "a", buffering=1)

    def write(self, record: dict) -> None:
        if self._handle:
            self.history.append(record)
            self._handle.write(json.dumps(record) + "\n")

    def close(self) -> None:
        if self._handle:
            self._handle.close()


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")
