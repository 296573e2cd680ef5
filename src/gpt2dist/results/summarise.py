"""One row per configuration (strategy, precision, processes, size, placement) from its undisturbed repeats: the
geometric mean of each run's steady-state numbers with a 95% interval on the log scale, its speedup over the
baseline paired by repeat round, scaling efficiency, MFU on GPUs, whether its numerics need more steps, and the
step models' predictions beside the measurements (forecast.prediction)."""

from __future__ import annotations

import math

import pandas as pd

from gpt2dist.config.configuration import config_id
from gpt2dist.config.placement import Kind, Placement
from gpt2dist.config.schema import PRECISIONS
from gpt2dist.config.sizes import flops_per_token
from gpt2dist.config.split import strategy_order
from gpt2dist.config.strategies import REFERENCE
from gpt2dist.forecast.prediction import with_predictions
from gpt2dist.pipeline.study import Study
from gpt2dist.results.convergence import needs_more_steps, reference_rows
from gpt2dist.results.run_table import config_keys, size_of
from gpt2dist.results.statistics import log_interval, paired_ratio, verdict
from gpt2dist.results.time_ledger import LEDGER
from gpt2dist.system.hardware import mfu, peak_flops


SUMMARISED = ["tokens_per_s", "tokens_per_s_per_device", "samples_per_s", "step_time_s", "step_time_p90_s",
              "time_per_epoch_s", "overhead_s", "peak_mem_bytes", "model_state_bytes", "final_val_loss",
              "final_val_ppl", "time_to_target_s", "energy_j_per_token", "energy_to_target_j"]


# Fixed by the configuration (model-state bytes by part, modelled traffic): every repeat has the same value
PER_CONFIGURATION = ["param_bytes", "grad_bytes", "optimizer_bytes", "predicted_model_state_bytes", "comm_bytes_per_step",
                     "link_bytes_per_step", "crossing_bytes_per_step"]


def in_study_order(frame: pd.DataFrame, sizes: list[str | None] | None = None) -> pd.DataFrame:
    """Rows by model size in the study's order (where it trains sizes: `sizes`, the plan's, else their order in
    `frame`, a table already in the study's order), then single, dp, ddp, horovod, fsdp; then precision; then
    process count; then one machine before emulated nodes, fastest link first."""
    strategies = {name: rank for rank, name in enumerate(sorted(set(frame["strategy"]), key=strategy_order))}
    key = frame["strategy"].map(strategies) * 1000 + frame["precision"].map(PRECISIONS.index) * 100 + frame["nproc"]
    nodes = frame["nodes"] if "nodes" in frame else 1
    link = -frame["link_mbit"].fillna(math.inf) if "link_mbit" in frame else 0
    order = list(dict.fromkeys(sizes or frame["size"])) if "size" in frame else []
    size = frame["size"].map({s: i for i, s in enumerate(order)}) if "size" in frame else 0
    ordered = frame.assign(_size=size, _order=key, _nodes=nodes, _link=link)
    columns = ["_size", "_order", "_nodes", "_link"]
    return ordered.sort_values(columns, kind="stable").drop(columns=columns).reset_index(drop=True)


def baseline_of(row: dict, configs: set[str]) -> str | None:
    """What a configuration's speedup divides by. On one machine: the one-process run of the same precision,
    single's, else the strategy's own. Across a cluster's nodes: the same strategy and precision on one node
    with the same processes per node, so the speedup is what the extra nodes bring. Never another precision
    (dividing an fp16 run by an fp32 one would count the mixed-precision gain as scaling), nor another size."""
    strategy, precision, size = row["strategy"], row["precision"], size_of(row)
    if Placement.of(row).kind is Kind.CLUSTER:
        candidates = [config_id(strategy, precision, row["nproc"] // row["nodes"], size=size)]
    else:
        candidates = [config_id(REFERENCE, precision, 1, size=size), config_id(strategy, precision, 1, size=size)]
    return next((candidate for candidate in candidates if candidate in configs), None)


def summarise(runs: pd.DataFrame, study: Study, device_name: str | None) -> pd.DataFrame:
    """One row per configuration from its undisturbed runs. A configuration whose every run was
    disturbed is summarised from them all and says so (`from_disturbed`), never silently."""
    rows, used = [], {}
    keys_of = config_keys(runs)
    for keys, group in runs.groupby(keys_of, sort=False, dropna=False):
        quiet = group[group["disturbed"] == ""]
        chosen = quiet if len(quiet) else group
        used[keys[0]] = chosen.set_index("repeat")
        row = dict(zip(keys_of, keys)) | {"repeats": len(chosen), "disturbed_runs": len(group) - len(quiet),
                                              "from_disturbed": quiet.empty,
                                              "planned_repeats": sum(r.config_id == keys[0] for r in study.runs)}
        for metric in SUMMARISED:
            centre, low, high = log_interval(chosen[metric])
            row |= {metric: centre, f"{metric}_ci_low": low, f"{metric}_ci_high": high}
        for part in PER_CONFIGURATION + [c for c in chosen if c.startswith(LEDGER) or c.startswith("traced_")]:
            row[part] = chosen[part].median() if part in chosen else math.nan  # a column runs collected before lack
        row["grad_accum_steps"] = chosen["grad_accum_steps"].iloc[0]
        row["backend"] = chosen["backend"].iloc[0]
        row["busbw_gb_s"] = chosen["busbw_gb_s"].median()
        row["steps_to_target"] = chosen["steps_to_target"].median()
        row["reached_target"] = int(chosen["steps_to_target"].notna().sum())
        rows.append(row)
    summary = in_study_order(pd.DataFrame(rows), study.sizes)  # the runs are in run-id order: large before medium
    summary["label"] = summary["config_id"].map(study.labels).fillna("")
    configs = set(summary["config_id"])
    summary["baseline"] = [baseline_of(row, configs) for row in summary.to_dict("records")]
    ratios = []
    only_disturbed = set(summary.loc[summary["from_disturbed"], "config_id"])
    for config, baseline in zip(summary["config_id"], summary["baseline"]):
        if not isinstance(baseline, str):
            ratios.append((math.nan, math.nan, math.nan, 0, "no baseline"))
        elif baseline == config:
            ratios.append((1.0, 1.0, 1.0, len(used[config]), "baseline"))
        else:
            ratio = paired_ratio(used[config]["tokens_per_s"], used[baseline]["tokens_per_s"])
            judged = verdict(ratio[1], ratio[2], ratio[3])
            ratios.append((*ratio, "only disturbed runs" if {config, baseline} & only_disturbed else judged))
    summary[["speedup", "speedup_ci_low", "speedup_ci_high", "speedup_pairs", "vs_baseline"]] = pd.DataFrame(
        ratios, index=summary.index)
    # the speedup per unit of what was added: processes over the baseline's (nodes, across a cluster)
    nproc = summary.set_index("config_id")["nproc"]
    added = summary["nproc"] / summary["baseline"].map(nproc).fillna(1)
    for column in ("", "_ci_low", "_ci_high"):
        summary[f"scaling_efficiency{column}"] = summary[f"speedup{column}"] / added
    def utilisation(row) -> float:
        """Against the peak of the arithmetic this row ran (fp32 rows against the fp32 peak, not bf16's)."""
        peak = peak_flops(device_name, row["precision"]) if device_name else None
        if not peak:
            return math.nan
        return mfu(row["tokens_per_s"], flops_per_token(study.model(size_of(row))), row["nproc"], peak)

    summary["mfu"] = summary.apply(utilisation, axis=1)
    reference = {size: reference_rows(part)["steps_to_target"]
                 for size, part in by_size(runs[runs["disturbed"] == ""]).items()}
    summary["numerics"] = [needs_more_steps(used[row["config_id"]]["steps_to_target"],
                                            reference.get(size_of(row), pd.Series(dtype=float)))
                           for row in summary.to_dict("records")]
    return with_predictions(summary, study.device, study.preset.train)


def by_size(frame: pd.DataFrame) -> dict[str | None, pd.DataFrame]:
    """`frame`'s rows per model size (one part, None, where the study trains only the preset's model)."""
    if "size" not in frame:
        return {None: frame}
    return {size: part for size, part in frame.groupby("size", sort=False)}
