"""Reading the files an earlier stage wrote: a missing or unreadable one ends the command with one
`error:` line naming the stage that writes it, instead of a traceback."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from gpt2dist.errors import UsageError
from gpt2dist.io import cannot_be_read

if TYPE_CHECKING:
    import pandas as pd

T = TypeVar("T")


def _read(path: Path, producer: str, parse: Callable[[Path], T]) -> T:
    try:
        return parse(path)
    except FileNotFoundError:
        raise UsageError(f"{path} is missing; run `{producer}` first") from None
    except (OSError, ValueError) as exc:  # json, pandas and UnicodeDecodeError report bad content as ValueError
        raise cannot_be_read(path, exc, f"re-run `{producer}`") from None


# What `gpt2dist collect` writes to summary.json (results/collect.py, tested equal): a file without them is not
# its output, and the commands that read it name that instead of failing on a missing key.
SUMMARY_KEYS = ("preset", "hardware", "device", "excluded_steps", "target_val_loss", "versions", "code",
                "dropped_configurations", "mixed_hardware", "missing_runs", "disturbed_runs", "answer", "configs",
                "findings", "link_model", "added_rounds", "traces")


def read_json(path: Path, producer: str, required: tuple[str, ...] = ()) -> dict:
    """A JSON object; with `required`, one that holds those keys, as `producer` writes it."""
    found = _read(path, producer, lambda p: json.loads(p.read_text()))
    missing = [key for key in required if key not in found] if isinstance(found, dict) else list(required)
    if missing:
        raise UsageError(f"{path} is not what `{producer}` writes (no {', '.join(missing[:3])}"
                         f"{' and more' if len(missing) > 3 else ''}); re-run `{producer}`")
    return found


def read_summary(results: Path) -> dict:
    return read_json(Path(results) / "summary.json", "gpt2dist collect", SUMMARY_KEYS)


def read_jsonl(path: Path, producer: str) -> list[dict]:
    return _read(path, producer, lambda p: [json.loads(line) for line in p.read_text().splitlines()])


def read_csv(path: Path, producer: str) -> pd.DataFrame:
    import pandas as pd  # here: `gpt2dist progress`, after every run, reads only JSON

    return _read(path, producer, pd.read_csv)
