"""`gpt2dist collect`: every run of the study -> one tidy table and a per-configuration summary, in stages: the
runs read (results.run_table), each run's numbers and conditions (results.per_run), each configuration's
statistics (results.summarise), the kept traces (results.traces), then what ranks and judges them: the tiers
(results.ranking), the papers' claims (results.findings) and the link model (forecast.link_model).

It writes metrics.csv (one row per run and step), runs.csv (one row per run, with the conditions it was measured
in and whether it was disturbed), summary.csv/json (one row per configuration; a run that failed or is missing
does not stop the others from being summarised: summary.json lists it, and the report says so first),
link_model.csv, headline.json and loss_curves.csv (the compact views DVC shows, results.compact) and traces/; where
runs kept their final checkpoints, summary.json names the run to export at each placement (results.exports)."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import pandas as pd

from gpt2dist.data.shards import read_meta
from gpt2dist.forecast.link_model import predicted_vs_measured
from gpt2dist.inputs import read_json
from gpt2dist.io import atomic_open, atomic_write_json
from gpt2dist.pipeline.layout import added_round_file
from gpt2dist.pipeline.study import configurations, Study
from gpt2dist.results.compact import write_compact_views
from gpt2dist.results.convergence import target_loss
from gpt2dist.results.disturbance import outliers
from gpt2dist.results.exports import runs_to_export
from gpt2dist.results.findings import check_claims
from gpt2dist.results.per_run import code_of, hardware_label, per_run, refuse_if_too_disturbed, refuse_mixed_hardware
from gpt2dist.results.ranking import rank
from gpt2dist.results.run_table import tidy_table
from gpt2dist.results.summarise import by_size, summarise
from gpt2dist.results.traces import copy_traces, kept_traces


log = logging.getLogger(__name__)


# Tables keep 10 significant digits: the last of a float's 17 can differ between CPUs that take other SIMD paths
# (AVX2 or AVX-512) through the same statistics, and a bundle must rebuild to the same bytes on either.
CANONICAL_FLOAT = "%.10g"


def _json_rows(frame: pd.DataFrame, key: str) -> dict:
    return {row.pop(key): {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in row.items()}
            for row in json.loads(frame.to_json(orient="records"))}


def added_rounds(study: Study, out_dir: Path) -> list[dict]:
    """What the study's added rounds decided (results/added_repeats.py writes each), in order."""
    plans = []
    for k in range(1, study.preset.study.added_repeats.rounds + 1):
        path = Path(added_round_file(k, out_dir))
        if not path.exists():
            break
        plans.append(read_json(path, "gpt2dist add-round", ("round", "runs", "stopped", "budget")))
    return plans


def collect(study: Study, runs_dir: Path, data_dir: Path, out_dir: Path, *, mixed_hardware: bool = False) -> dict:
    table, records, missing = tidy_table(study, Path(runs_dir))
    train_tokens = read_meta(Path(data_dir))["splits"]["train"]["tokens"]
    hardware, gpu_name = hardware_label(records)
    targets = {size: target_loss(part, study.preset.study.target_val_loss) for size, part in by_size(table).items()}
    runs = per_run(table, records, study, train_tokens, targets)
    runs["disturbed"] = runs["disturbed"].where(runs["disturbed"] != "",
                                                outliers(runs, study.preset.study.max_repeat_deviation))
    if not mixed_hardware:
        refuse_mixed_hardware(runs)
    disturbed = runs[runs["disturbed"] != ""]
    refuse_if_too_disturbed(disturbed, study.preset.study.max_disturbed, runs_dir)
    summary = summarise(runs, study, gpu_name)
    for run_id, reason in missing.items():
        log.warning("collect: %s left out: %s", run_id, reason)
    for row in disturbed.itertuples():
        log.warning("collect: %s disturbed, left out of the statistics: %s", row.run_id, row.disturbed)
    out_dir = Path(out_dir)
    model = predicted_vs_measured(summary)
    for frame, name in ((table, "metrics.csv"), (runs, "runs.csv"), (summary, "summary.csv"), (model, "link_model.csv")):
        with atomic_open(out_dir / name, "w") as handle:
            frame.to_csv(handle, index=False, float_format=CANONICAL_FLOAT)
    write_compact_views(out_dir, [run.config_id for run in configurations(study)], summary, table)
    traces = copy_traces(kept_traces(study, records, Path(runs_dir)), Path(runs_dir), out_dir)
    answer = rank(runs, summary)
    exports = runs_to_export(study, records, Path(runs_dir), answer)
    first = next(iter(records.values()))
    result = {
        "preset": study.preset_name,
        "hardware": hardware,
        "device": study.device,
        "excluded_steps": study.preset.study.excluded_steps,
        # one target per model size: a larger model learns further in the same steps
        "target_val_loss": targets[None] if list(targets) == [None] else targets,
        "versions": first["versions"],
        "code": code_of(records.values()),
        "dropped_configurations": study.dropped,
        "mixed_hardware": sorted(runs["hardware"].unique()) if mixed_hardware else None,
        "missing_runs": missing,
        "disturbed_runs": dict(zip(disturbed["run_id"], disturbed["disturbed"])),
        "answer": answer,
        "configs": _json_rows(summary, "config_id"),
        "findings": check_claims(runs, summary, model),
        "link_model": json.loads(model.to_json(orient="records")),
        "added_rounds": added_rounds(study, out_dir),
        "traces": traces,
        **({"export": exports} if exports else {}),  # only where runs kept their final checkpoints
    }
    atomic_write_json(out_dir / "summary.json", result)
    return result
