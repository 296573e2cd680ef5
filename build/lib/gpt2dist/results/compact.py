"""The two small views of a study that DVC shows at a terminal, beside the full tables:
headline/<configuration>.json (`dvc metrics show/diff`: DVC prints one row per metrics file, so
one file per configuration with three numbers gives a table of configurations by three columns,
not the one ~450-column line of summary.json) and loss_curves.csv (`dvc plots show`: one line
per configuration, not every run's steps joined into one line). Both are small enough for git.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from gpt2dist.io import atomic_open, atomic_write_json

HEADLINE = ("tokens_per_s", "speedup", "final_val_loss")


def _significant(value: float, digits: int = 4) -> float | None:
    """Four significant digits: what a terminal table needs, and a diff that only shows real changes."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return float(f"{value:.{digits}g}")


def headline(summary: pd.DataFrame, config_ids: list[str]) -> dict[str, dict]:
    """Every configuration of the study; one with no completed run gets nulls (its file is still declared)."""
    rows = summary.set_index("config_id")
    return {config: {name: _significant(rows.at[config, name]) if config in rows.index else None for name in HEADLINE}
            for config in config_ids}


def loss_curves(table: pd.DataFrame, config_ids: list[str]) -> pd.DataFrame:
    """Train loss per step, one column per configuration (the mean over its completed repeats)."""
    wide = table.pivot_table(index="step", columns="config_id", values="loss", aggfunc="mean")
    return wide.reindex(columns=config_ids).reset_index()  # a configuration with no run: an empty column


def write_compact_views(out_dir: Path, config_ids: list[str], summary: pd.DataFrame, table: pd.DataFrame) -> None:
    numbers = headline(summary, config_ids)
    for config_id, values in numbers.items():
        atomic_write_json(out_dir / "headline" / f"{config_id}.json", values)
    for stale in (out_dir / "headline").glob("*.json"):  # a configuration the study no longer has
        if stale.stem not in numbers:
            stale.unlink()
    with atomic_open(out_dir / "loss_curves.csv", "w") as handle:
        loss_curves(table, config_ids).to_csv(handle, index=False)
