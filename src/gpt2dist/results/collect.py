"""`gpt2dist collect`: every run of the study -> one tidy table and a per-configuration summary.

metrics.csv has one row per run and step (train metrics, and the validation loss at the
steps where it was measured); runs.csv one row per run, with the conditions it was measured in
and whether it was disturbed (results.disturbance); summary.csv/json one row per configuration
(strategy, precision, nproc): the geometric mean over its undisturbed repeats of each run's
steady-state numbers (which leave out the first `study.excluded_steps` steps), with a 95%
interval on the log scale, and its speedup over the baseline paired by repeat round
(results.statistics). A run that failed or is missing does not stop the others from being
summarised: summary.json lists it, and the report says so first. headline.json and
loss_curves.csv are the compact views DVC shows (results.compact); link_model.csv sets runs on
emulated nodes' links against the link model's prediction (results.link_model). traces/ holds one
run's kept trace per rank for each configuration (its first repeat that kept them), for Perfetto and
Holistic Trace Analysis.
"""

from __future__ import annotations

import json
import logging
import math
import re
import shutil
from pathlib import Path

import pandas as pd
from pydantic import ValidationError

from gpt2dist.config.configuration import config_id
from gpt2dist.config.machine import describe_cpu
from gpt2dist.config.memory import predict as predict_memory
from gpt2dist.config.placement import Kind, Placement
from gpt2dist.config.schema import PRECISIONS, RunSpec
from gpt2dist.config.split import strategy_order
from gpt2dist.config.sizes import flops_per_token
from gpt2dist.config.strategies import REFERENCE, crossing_bytes
from gpt2dist.data.shards import read_meta
from gpt2dist.errors import UsageError
from gpt2dist.io import atomic_open, atomic_write_json
from gpt2dist.pipeline.duration import wall_seconds
from gpt2dist.pipeline.layout import TRACES_DIR, added_round_file
from gpt2dist.pipeline.study import configurations, Study
from gpt2dist.results.compact import write_compact_views
from gpt2dist.results.convergence import energy_per_token, needs_more_steps, reference_rows, target_loss, to_target
from gpt2dist.results.disturbance import conditions_of, disturbance, outliers
from gpt2dist.results.findings import check_claims
from gpt2dist.results.inputs import read_json, read_jsonl
from gpt2dist.results.link_model import predicted_vs_measured
from gpt2dist.results.prediction import with_predictions
from gpt2dist.results.ranking import rank
from gpt2dist.results.statistics import log_interval, paired_ratio, verdict
from gpt2dist.results.time_ledger import LEDGER
from gpt2dist.system.hardware import mfu, peak_flops

log = logging.getLogger(__name__)
# Tables keep 10 significant digits: the last of a float's 17 can differ between CPUs that take other SIMD paths
# (AVX2 or AVX-512) through the same statistics, and a bundle must rebuild to the same bytes on either.
CANONICAL_FLOAT = "%.10g"

# link_mbit: NaN when unshaped; emulated: nodes emulated on one machine (False for one node and a cluster's); size:
# the model size, a column only in studies that train sizes of their own (config.sizes)
CONFIG_KEYS = ["config_id", "strategy", "precision", "nproc", "size", "nodes", "emulated", "link_mbit"]
SUMMARISED = ["tokens_per_s", "tokens_per_s_per_device", "samples_per_s", "step_time_s", "step_time_p90_s",
              "time_per_epoch_s", "overhead_s", "peak_mem_bytes", "model_state_bytes", "final_val_loss",
              "final_val_ppl", "time_to_target_s", "energy_j_per_token", "energy_to_target_j"]
# Fixed by the configuration (model-state bytes by part, modelled traffic): every repeat has the same value
PER_CONFIGURATION = ["param_bytes", "grad_bytes", "optimizer_bytes", "predicted_model_state_bytes", "comm_bytes_per_step",
                     "link_bytes_per_step", "crossing_bytes_per_step"]


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


def kept_traces(study: Study, records: dict[str, dict], runs_dir: Path) -> dict[str, dict]:
    """Config id -> the run whose traces stand for it: its first repeat (in study order) that kept one file per
    rank, each there. Runs trained before traces were kept have none: their configurations are left out."""
    picked = {}
    for run in study.runs:
        kept = (records.get(run.run_id) or {}).get("trace")
        if run.config_id not in picked and kept and all((runs_dir / run.run_id / f).is_file() for f in kept["files"]):
            picked[run.config_id] = {"run_id": run.run_id, "step": kept["step"], "files": kept["files"]}
    return picked


def copy_traces(picked: dict[str, dict], runs_dir: Path, out_dir: Path) -> dict[str, dict]:
    """Copy each configuration's kept traces to out_dir/traces, named by configuration and rank (each file written
    atomically, those of an earlier collect that no configuration keeps now deleted); what summary.json says of
    them, their paths relative to out_dir."""
    listed, wanted = {}, set()
    (out_dir / TRACES_DIR).mkdir(parents=True, exist_ok=True)  # a study without traces has it too: a rule's output
    for config, kept in picked.items():
        files = []
        for world_rank, name in enumerate(kept["files"]):
            relative = f"{TRACES_DIR}/{config}.rank{world_rank}.json.gz"
            with open(runs_dir / kept["run_id"] / name, "rb") as source, atomic_open(out_dir / relative, "wb") as out:
                shutil.copyfileobj(source, out)
            files.append(relative)
            wanted.add(relative)
        listed[config] = {**kept, "files": files}
    for stale in (out_dir / TRACES_DIR).glob("*.json.gz"):
        if f"{TRACES_DIR}/{stale.name}" not in wanted:
            stale.unlink()
    return listed


def _link_bytes_per_step(record: dict, steps: int) -> float:
    """Measured on emulated nodes: the busiest node's sent bytes over the run, per step (start-up,
    evaluation and TCP/IP headers included, so a little above the modelled payload)."""
    links = (record.get("emulated_nodes") or {}).get("link_bytes")
    if not links or not steps:
        return math.nan
    return max(counts["tx_bytes"] for counts in links.values()) / steps


def _ledger_of(ledger: dict | None) -> dict:
    """The run's time ledger as columns: seconds per step by part, and the collectives' traced payload."""
    if not ledger:
        return {}
    parts = {f"{LEDGER}{name}": value for name, value in ledger.items() if name.endswith("_s")}
    traced = ledger.get("collectives") or {}
    return parts | {"traced_collective_bytes_per_step": sum(c["bytes"] for c in traced.values()) if traced
                    else math.nan}


def _crossing_bytes(record: dict) -> float:
    """The modelled bytes per step of the groups whose ranks span the run's nodes (emulated ones, or a cluster's):
    what their links carry (config.strategies.crossing_bytes); NaN for a spec this code no longer reads."""
    try:
        spec = RunSpec.model_validate(record["config"])
    except ValidationError:
        return math.nan
    return crossing_bytes(spec, (record.get("emulated_nodes") or {}).get("nodes") or spec.nodes)


def _predicted_state(record: dict) -> float:
    """config.memory's model state for the run's own spec; NaN for a record of a spec this code no longer reads."""
    try:
        spec = RunSpec.model_validate(record["config"])
    except ValidationError:
        return math.nan
    return predict_memory(spec, busiest=False).state  # rank 0's, as the run counted it


def per_run(table: pd.DataFrame, records: dict[str, dict], study: Study, train_tokens: int,
            targets: dict[str | None, float]) -> pd.DataFrame:
    """One row per run: steady-state medians after warm-up, percentiles, memory, the final validation
    loss, the conditions it ran in, and whether they disturbed it."""
    excluded_steps = study.preset.study.excluded_steps
    rows = []
    for run_id, run in table.groupby("run_id", sort=True):
        # steps profiled for the ledger ran slowed: not throughput samples
        traced = run["traced"].eq(True) if "traced" in run.columns else pd.Series(False, index=run.index)
        steady = run[(run["step"] >= excluded_steps) & ~traced].dropna(subset=["tokens_per_s"])
        if steady.empty:
            raise UsageError(f"run {run_id} has no step after study.excluded_steps={excluded_steps}; lower it")
        record = records[run_id]
        evals = run.dropna(subset=["val_loss"])
        tokens_per_s = steady["tokens_per_s"].median()
        state = record.get("model_state_bytes") or {}
        measures = conditions_of(record, steady)
        wall = wall_seconds(record)
        steps_to_target, time_to_target = to_target(run, targets[size_of(run.iloc[0])])
        per_token = energy_per_token(steady, int(run["nproc"].iloc[0]), record["tokens_per_step"])
        rows.append({
            **run.iloc[0][config_keys(run)].to_dict(), "run_id": run_id, "repeat": int(run["repeat"].iloc[0]),
            "tokens_per_s": tokens_per_s,
            "tokens_per_s_per_device": tokens_per_s / run["nproc"].iloc[0],
            "samples_per_s": steady["samples_per_s"].median(),
            "step_time_s": steady["step_time_s"].median(),
            "step_time_p90_s": steady["step_time_s"].quantile(0.9),
            "time_per_epoch_s": train_tokens / tokens_per_s,
            "wall_s": wall,
            # start-up (imports, rendezvous, compile), evaluation and checkpoints: wall time outside the steps
            "overhead_s": wall - run["step_time_s"].sum() if record.get("resumed_from_step", 0) == 0 else math.nan,
            "peak_mem_bytes": run["peak_mem_bytes"].max(),
            "peak_reserved_bytes": run["peak_reserved_bytes"].max() if "peak_reserved_bytes" in run else math.nan,
            "model_state_bytes": state.get("total", math.nan),
            "param_bytes": state.get("params", math.nan),
            "grad_bytes": state.get("grads", math.nan),
            "optimizer_bytes": state.get("optimizer", math.nan),
            "predicted_model_state_bytes": _predicted_state(record),
            "comm_bytes_per_step": (record.get("communication") or {}).get("bytes_per_step", math.nan),
            "link_bytes_per_step": _link_bytes_per_step(record, len(run.dropna(subset=["tokens_per_s"]))),
            "crossing_bytes_per_step": _crossing_bytes(record),
            "final_val_loss": evals["val_loss"].iloc[-1] if len(evals) else math.nan,
            "final_val_ppl": evals["val_ppl"].iloc[-1] if len(evals) else math.nan,
            "steps_to_target": steps_to_target,
            "time_to_target_s": time_to_target,
            "energy_j_per_token": per_token,
            "energy_to_target_j": per_token * steps_to_target * record["tokens_per_step"],
            "grad_accum_steps": record.get("grad_accum_steps"),
            "backend": (record.get("placement") or {}).get("backend"),
            "busbw_gb_s": (record.get("interconnect") or {}).get("busbw_gb_s", math.nan),
            "hardware": hardware_of(record),
            **_ledger_of(record.get("ledger")),
            **measures,
            "disturbed": disturbance(measures, study.preset.study),
        })
    return pd.DataFrame(rows)


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


def code_of(records) -> dict:
    """The commits the runs were made from, and whether any came from a tree with uncommitted changes: a study
    is regenerable from a commit only when none did."""
    states = [record.get("git") or {} for record in records]
    return {"commits": sorted({state["commit"] for state in states if state.get("commit")}),
            "dirty": any(state.get("dirty") for state in states)}


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


def hardware_of(record: dict) -> str:
    """What a run's throughput depends on besides its strategy: the device model of every node (GPU, else CPU,
    with its family, model and speed-relevant instruction sets where the run recorded them, since two virtual
    machines can both call themselves "AMD EPYC") and, with GPUs, how they are linked within a node (NVLink or
    PCIe, from `nvidia-smi topo -m`)."""
    devices = record["devices"]
    nodes = record.get("node_hardware") or [{"devices": {(devices.get("gpus") or [devices["cpu"]])[0]: 1}}]
    models = sorted({model for node in nodes for model in node["devices"]})
    if not devices.get("gpus"):
        return describe_cpu(" + ".join(models), devices.get("cpu_identity") or {})
    links = "NVLink" if re.search(r"\bNV\d+\b", devices.get("topology") or "") else "PCIe"
    return f"{' + '.join(models)} ({links})"


def refuse_mixed_hardware(runs: pd.DataFrame) -> None:
    """Throughput from different machines is not a comparison of strategies."""
    kinds = runs.groupby("hardware")["run_id"].apply(list)
    if len(kinds) > 1:
        where = "; ".join(f"{kind}: {', '.join(ids[:3])}{' ...' if len(ids) > 3 else ''}" for kind, ids in kinds.items())
        raise UsageError(f"the runs were made on different hardware ({where}); re-run them on one kind of machine, or "
                         "compare them anyway with `gpt2dist collect --mixed-hardware`")


def hardware_label(records: dict[str, dict]) -> tuple[str, str | None]:
    """('2x NVIDIA H100 80GB HBM3 (80 GiB, driver 580.95, 700 W limit, NVLink)', gpu name) or ('AMD EPYC (family
    25 model 1, AVX2 only; 2 cores at 2.4 GHz)', None) from the runs' records, with what they recorded; a CPU
    study with bf16 runs on a CPU without bf16 instructions says so, as its bf16 rows are slow for it."""
    record = next(iter(records.values()))
    devices = record["devices"]
    if devices.get("gpus"):
        gpus, name = devices["gpus"], devices["gpus"][0]
        facts = [f"{devices['gpu_memory_gib'][0]} GiB" if devices.get("gpu_memory_gib") else "",
                 f"driver {devices['driver']}" if devices.get("driver") else "",
                 f"{devices['power_limit_w']:.0f} W limit" if devices.get("power_limit_w") else "",
                 hardware_of(record).removeprefix(name).strip(" ()")]
        return f"{len(gpus)}x {name} ({', '.join(fact for fact in facts if fact)})", name
    emulated = devices.get("cpu_bf16") == "emulated" and any(r.get("precision") == "bf16" for r in records.values())
    identity = devices.get("cpu_identity") or {}
    cores = f"{devices['cpu_cores']} cores" + (f" at {identity['mhz'] / 1000:.1f} GHz" if identity.get("mhz") else "")
    model = hardware_of(record)
    if model.endswith(")"):
        return f"{model[:-1]}; {cores}{', bf16 emulated' if emulated else ''})", None
    # runs from before gpt2dist recorded the CPU's identity: what they did record still tells machines apart
    bf16 = {"native": "bf16 in hardware", "emulated": "bf16 emulated"}.get(devices.get("cpu_bf16"))
    return f"{model} ({'; '.join(filter(None, [bf16, cores, 'family, model and flags not recorded']))})", None


def refuse_if_too_disturbed(disturbed: pd.DataFrame, limit: int | None, runs_dir: Path) -> None:
    if limit is None or len(disturbed) <= limit:
        return
    outputs = " ".join(str(Path(runs_dir) / run_id / "run.json") for run_id in disturbed["run_id"])
    raise UsageError(f"{len(disturbed)} runs were disturbed (study.max_disturbed={limit}): "
                     f"{', '.join(disturbed['run_id'])}; on a quieter machine re-run them with "
                     f"`snakemake --cores all --forcerun {outputs}`")


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
        "answer": rank(runs, summary),
        "configs": _json_rows(summary, "config_id"),
        "findings": check_claims(runs, summary, model),
        "link_model": json.loads(model.to_json(orient="records")),
        "added_rounds": added_rounds(study, out_dir),
        "traces": traces,
    }
    atomic_write_json(out_dir / "summary.json", result)
    return result
