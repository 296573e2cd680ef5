"""Reading the files an earlier stage wrote: a missing or unreadable one ends the command with one
`error:` line naming the stage that writes it, instead of a traceback."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pandas as pd

from gpt2dist.errors import UsageError

T = TypeVar("T")


def _read(path: Path, producer: str, parse: Callable[[Path], T]) -> T:
    try:
        return parse(path)
    except FileNotFoundError:
        raise UsageError(f"{path} is missing; run `{producer}` first") from None
    except (OSError, ValueError) as exc:  # json, pandas and UnicodeDecodeError report bad content as ValueError
        why = " ".join(str(exc).split())
        raise UsageError(f"{path} cannot be read ({why}); re-run `{producer}`") from None


def read_json(path: Path, producer: str) -> dict:
    return _read(path, producer, lambda p: json.loads(p.read_text()))


def read_jsonl(path: Path, producer: str) -> list[dict]:
    return _read(path, producer, lambda p: [json.loads(line) for line in p.read_text().splitlines()])


def read_csv(path: Path, producer: str) -> pd.DataFrame:
    return _read(path, producer, pd.read_csv)
