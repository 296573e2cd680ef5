"""`gpt2dist collect`: every run of the study -> one tidy table and a per-configuration summary.

metrics.csv has one row per run and step (train metrics, and the validation loss at the
steps where it was measured); runs.csv one row per run. summary.csv/json have one row per configuration
(strategy, precision, nproc): the median over repeats and a 95% confidence interval
(t-interval of the mean over repeats) of each run's steady-state numbers, which leave
out the first `study.warmup_steps` steps (compilation, allocator warm-up).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
from scipy import stats

from gpt2dist.config import PRECISIONS, STRATEGIES
from gpt2dist.data.shards import read_meta
from gpt2dist.errors import UsageError
from gpt2dist.io import atomic_open, atomic_write_json
from gpt2dist.pipeline.study import Study
from gpt2dist.results.inputs import read_json, read_jsonl
from gpt2dist.system.hardware import mfu, peak_flops
from gpt2dist.training.model import flops_per_token

CONFIG_KEYS = ["config_id", "strategy", "precision", "nproc"]
SUMMARISED = ["tokens_per_s", "samples_per_s", "step_time_s", "time_per_epoch_s", "peak_mem_bytes", "final_val_loss",
              "final_val_ppl"]


def read_run(run_dir: Path) -> tuple[dict, pd.DataFrame]:
    """run.json and metrics.jsonl of one finished run; refuses anything not completed."""
    record_path = run_dir / "run.json"
    if not record_path.exists():
        raise UsageError(f"run {run_dir.name} has no run.json in {run_dir}; train it first")
    record = read_json(record_path, "gpt2dist train")
    if record.get("status") != "completed":
        raise UsageError(f"run {run_dir.name} is not completed (status '{record.get('status')}'); re-run it")
    return record, pd.DataFrame(read_jsonl(run_dir / "metrics.jsonl", "gpt2dist train"))


def tidy_table(study: Study, runs_dir: Path) -> tuple[pd.DataFrame, dict[str, dict]]:
    frames, records = [], {}
    for run in study.runs:
        record, lines = read_run(runs_dir / run.run_id)
        records[run.run_id] = record
        train = lines[lines["kind"] == "train"].drop(columns=["kind", "val_loss", "val_ppl"], errors="ignore")
        train = train.assign(elapsed_s=train["step_time_s"].cumsum())
        evals = lines[lines["kind"] == "eval"].reindex(columns=["step", "val_loss", "val_ppl"])
        table = train.merge(evals, on="step", how="outer")
        frames.append(table.assign(run_id=run.run_id, config_id=run.config_id, strategy=run.strategy,
                                   precision=run.precision, nproc=run.nproc, repeat=run.repeat))
    table = pd.concat(frames, ignore_index=True).sort_values(["run_id", "step"], kind="stable")
    first = ["run_id", *CONFIG_KEYS[1:], "repeat", "step"]
    return table[first + [c for c in table.columns if c not in first]], records


def per_run(table: pd.DataFrame, warmup_steps: int, train_tokens: int) -> pd.DataFrame:
    """One row per run: steady-state medians after warm-up, peak memory, final validation loss."""
    rows = []
    for run_id, run in table.groupby("run_id", sort=True):
        steady = run[run["step"] >= warmup_steps].dropna(subset=["tokens_per_s"])
        if steady.empty:
            raise UsageError(f"run {run_id} has no step after study.warmup_steps={warmup_steps}; lower it")
        evals = run.dropna(subset=["val_loss"])
        tokens_per_s = steady["tokens_per_s"].median()
        rows.append({
            **run.iloc[0][CONFIG_KEYS].to_dict(), "run_id": run_id,
            "tokens_per_s": tokens_per_s,
            "samples_per_s": steady["samples_per_s"].median(),
            "step_time_s": steady["step_time_s"].median(),
            "time_per_epoch_s": train_tokens / tokens_per_s,
            "peak_mem_bytes": run["peak_mem_bytes"].max(),
            "final_val_loss": evals["val_loss"].iloc[-1] if len(evals) else math.nan,
            "final_val_ppl": evals["val_ppl"].iloc[-1] if len(evals) else math.nan,
        })
    return pd.DataFrame(rows)


def in_study_order(frame: pd.DataFrame) -> pd.DataFrame:
    """Rows ordered single, dp, ddp, horovod, fsdp; then precision; then process count."""
    key = frame["strategy"].map(STRATEGIES.index) * 1000 + frame["precision"].map(PRECISIONS.index) * 100 + frame["nproc"]
    return frame.assign(_order=key).sort_values("_order", kind="stable").drop(columns="_order").reset_index(drop=True)


def t_interval(values: pd.Series) -> tuple[float, float]:
    """95% t-interval of the mean; NaN with fewer than two values."""
    values = values.dropna()
    if len(values) < 2:
        return math.nan, math.nan
    half = stats.t.ppf(0.975, len(values) - 1) * values.std(ddof=1) / math.sqrt(len(values))
    return values.mean() - half, values.mean() + half


def baseline_of(strategy: str, precision: str, configs: set[str]) -> str | None:
    """The one-process run of the same precision that a configuration's speedup divides by:
    single's, else the strategy's own at one process. Never another precision: dividing an
    fp16 run by an fp32 one would count the mixed-precision gain as scaling."""
    for candidate in (f"single-{precision}-n1", f"{strategy}-{precision}-n1"):
        if candidate in configs:
            return candidate
    return None


def summarise(runs: pd.DataFrame, study: Study, device_name: str | None) -> pd.DataFrame:
    rows = []
    for keys, group in runs.groupby(CONFIG_KEYS, sort=False):
        row = dict(zip(CONFIG_KEYS, keys)) | {"repeats": len(group)}
        for metric in SUMMARISED:
            low, high = t_interval(group[metric])
            row |= {metric: group[metric].median(), f"{metric}_ci_low": low, f"{metric}_ci_high": high}
        rows.append(row)
    summary = in_study_order(pd.DataFrame(rows))
    by_config = summary.set_index("config_id")["tokens_per_s"]
    configs = set(by_config.index)
    summary["baseline"] = [baseline_of(s, p, configs) for s, p in zip(summary["strategy"], summary["precision"])]
    summary["speedup"] = summary["tokens_per_s"] / summary["baseline"].map(lambda b: by_config.get(b, math.nan))
    summary["scaling_efficiency"] = summary["speedup"] / summary["nproc"]
    per_token = flops_per_token(study.preset.model)

    def utilisation(row) -> float:
        """Against the peak of the arithmetic this row ran (fp32 rows against the fp32 peak, not bf16's)."""
        peak = peak_flops(device_name, row["precision"]) if device_name else None
        return mfu(row["tokens_per_s"], per_token, row["nproc"], peak) if peak else math.nan

    summary["mfu"] = summary.apply(utilisation, axis=1)
    return summary


def hardware_label(records: dict[str, dict]) -> tuple[str, str | None]:
    """('2x NVIDIA H100 80GB HBM3', gpu name) or ('AMD EPYC ... (2 cores)', None) from the runs' records."""
    devices = next(iter(records.values()))["devices"]
    if devices.get("gpus"):
        return f"{len(devices['gpus'])}x {devices['gpus'][0]}", devices["gpus"][0]
    return f"{devices['cpu']} ({devices['cpu_cores']} cores)", None


def collect(study: Study, runs_dir: Path, data_dir: Path, out_dir: Path) -> dict:
    table, records = tidy_table(study, Path(runs_dir))
    train_tokens = read_meta(Path(data_dir))["splits"]["train"]["tokens"]
    hardware, gpu_name = hardware_label(records)
    runs = per_run(table, study.preset.study.warmup_steps, train_tokens)
    summary = summarise(runs, study, gpu_name)
    out_dir = Path(out_dir)
    for frame, name in ((table, "metrics.csv"), (runs, "runs.csv"), (summary, "summary.csv")):
        with atomic_open(out_dir / name, "w") as handle:
            frame.to_csv(handle, index=False)
    first = next(iter(records.values()))
    result = {
        "preset": study.preset_name,
        "hardware": hardware,
        "device": study.device,
        "warmup_steps": study.preset.study.warmup_steps,
        "versions": first["versions"],
        "dropped_configurations": study.dropped,
        "configs": {
            row["config_id"]: {k: (None if isinstance(v, float) and math.isnan(v) else v)
                               for k, v in row.items() if k != "config_id"}
            for row in json.loads(summary.to_json(orient="records"))
        },
    }
    atomic_write_json(out_dir / "summary.json", result)
    return result

