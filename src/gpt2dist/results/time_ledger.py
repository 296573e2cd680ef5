"""The time ledger in the results: where each configuration's step goes (from run.json's `ledger`,
written by training/ledger.py), for summary.md's table, the answer's "why slower" and the figure."""

from __future__ import annotations

import math

import pandas as pd

LEDGER = "ledger_"  # the prefix of the ledger's columns in runs.csv and summary.csv
# run.json's ledger parts, in the order they stack, with what a reader calls them
PART_WORDS = {
    "compute_s": "compute",
    "comm_hidden_s": "communication hidden under compute",
    "comm_exposed_s": "exposed communication",
    "data_s": "data loading",
    "idle_s": "idle (host overhead, waiting)",
}


def ledger_columns(frame: pd.DataFrame | dict) -> list[str]:
    """The ledger columns present, in stacking order (none for runs made before the ledger existed)."""
    return [f"{LEDGER}{part}" for part in PART_WORDS if f"{LEDGER}{part}" in frame]


def _known(value) -> bool:
    return value is not None and not (isinstance(value, float) and math.isnan(value))


def why_slower(row: dict, fastest: dict) -> dict[str, float]:
    """Seconds per step each part takes beyond the fastest configuration's (same global batch, so the
    parts' differences add up to the step-time gap)."""
    return {column.removeprefix(LEDGER): row[column] - fastest[column] for column in ledger_columns(row)
            if _known(row.get(column)) and _known(fastest.get(column))}


def why_text(gap: dict[str, float]) -> str:
    """The parts that make up most of the gap, largest first: '+12.3 ms exposed communication, ...'."""
    added = sorted(((seconds, part) for part, seconds in gap.items() if seconds > 0), reverse=True)
    total = sum(seconds for seconds, _ in added)
    named = [f"+{seconds * 1e3:,.1f} ms {PART_WORDS[part]}" for seconds, part in added
             if seconds >= max(0.2 * total, 5e-5)]  # under 0.05 ms it would print as +0.0 ms
    return ", ".join(named)
