"""The study's runs read: each completed run's record and its metrics lines in one tidy table (one row per run and
step), and why each other run is left out (missing, failed, trained at another size). The first stage of
`gpt2dist collect`."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from gpt2dist.errors import UsageError
from gpt2dist.inputs import read_json, read_jsonl
from gpt2dist.pipeline.study import Study


# link_mbit: NaN when unshaped; emulated: nodes emulated on one machine (False for one node and a cluster's); size:
# the model size, a column only in studies that train sizes of their own (config.sizes)
CONFIG_KEYS = ["config_id", "strategy", "precision", "nproc", "size", "nodes", "emulated", "link_mbit"]


def read_run(run_dir: Path) -> tuple[dict, pd.DataFrame]:
    """run.json and metrics.jsonl of one finished run; refuses anything not completed."""
    record_path = run_dir / "run.json"
    if not record_path.exists():
        raise UsageError(f"run {run_dir.name} has no run.json in {run_dir}; train it first")
    record = read_json(record_path, "gpt2dist train")
    if record.get("status") != "completed":
        error = f": {record['error']}" if record.get("error") else ""
        raise UsageError(f"run {run_dir.name} did not complete (status '{record.get('status')}'{error}); running the "
                         "study again retries it")
    lines = read_jsonl(run_dir / "metrics.jsonl", "gpt2dist train")
    return record, pd.DataFrame([line for line in lines if line.get("kind") != "ledger"])  # run.json has the ledger


def config_keys(frame: pd.DataFrame) -> list[str]:
    """CONFIG_KEYS that `frame` has (size only where the study trains sizes)."""
    return [key for key in CONFIG_KEYS if key in frame]


def size_of(row: dict | pd.Series) -> str | None:
    """A row's model size; None for the preset's model (no column, or NaN in it)."""
    size = row.get("size")
    return size if isinstance(size, str) else None


def _size_named(size: str | None) -> str:
    return f"model size {size}" if size else "the preset's own model"


def tidy_table(study: Study, runs_dir: Path) -> tuple[pd.DataFrame, dict[str, dict], dict[str, str]]:
    """The completed runs' lines in one table, their records, and why each other run is left out."""
    frames, records, missing = [], {}, {}
    sizes = study.sizes != [None]
    for run in study.runs:
        try:
            record, lines = read_run(runs_dir / run.run_id)
        except UsageError as exc:
            missing[run.run_id] = str(exc)
            continue
        trained_at = (record.get("config") or {}).get("size", run.size)  # records before the size travelled
        if trained_at != run.size:
            missing[run.run_id] = (f"trained at {_size_named(trained_at)}, planned at {_size_named(run.size)}: "
                                   "another study's run; delete it to train it again")
            continue
        records[run.run_id] = record
        train = lines[lines["kind"] == "train"].drop(columns=["kind", "val_loss", "val_ppl"], errors="ignore")
        train = train.assign(elapsed_s=train["step_time_s"].cumsum())
        evals = lines[lines["kind"] == "eval"].reindex(columns=["step", "val_loss", "val_ppl"])
        table = train.merge(evals, on="step", how="outer")
        frames.append(table.assign(run_id=run.run_id, config_id=run.config_id, strategy=run.strategy,
                                   precision=run.precision, nproc=run.nproc, nodes=run.nodes, emulated=run.emulated,
                                   link_mbit=run.link_mbit if run.link_mbit else math.nan, repeat=run.repeat,
                                   **({"size": trained_at} if sizes else {})))
    if not frames:
        first = next(iter(missing.values()))
        raise UsageError(f"no run of the study has completed ({len(missing)} missing; the first: {first})")
    table = pd.concat(frames, ignore_index=True).sort_values(["run_id", "step"], kind="stable")
    first = ["run_id", *config_keys(table)[1:], "repeat", "step"]
    return table[first + [c for c in table.columns if c not in first]], records, missing
