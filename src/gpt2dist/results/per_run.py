"""One row per run: its steady-state numbers after warm-up, memory, the final validation loss, the modelled bytes
beside those its links measured, the time ledger, the conditions it ran in and whether they disturbed it; and the
machine it ran on, which every run of a comparison must share."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pandas as pd
from pydantic import ValidationError

from gpt2dist.config.machine import describe_cpu
from gpt2dist.config.memory import predict as predict_memory
from gpt2dist.config.schema import RunSpec
from gpt2dist.config.traffic import crossing_bytes
from gpt2dist.errors import UsageError
from gpt2dist.pipeline.duration import wall_seconds
from gpt2dist.pipeline.study import Study
from gpt2dist.results.convergence import energy_per_token, to_target
from gpt2dist.results.disturbance import conditions_of, disturbance
from gpt2dist.results.run_table import config_keys, size_of
from gpt2dist.results.time_ledger import LEDGER


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
    what their links carry (config.traffic.crossing_bytes); NaN for a spec this code no longer reads."""
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


def code_of(records) -> dict:
    """The commits the runs were made from, and whether any came from a tree with uncommitted changes: a study
    is regenerable from a commit only when none did."""
    states = [record.get("git") or {} for record in records]
    return {"commits": sorted({state["commit"] for state in states if state.get("commit")}),
            "dirty": any(state.get("dirty") for state in states)}


def hardware_of(record: dict) -> str:
    """What a run's throughput depends on besides its strategy: the device model of every node (GPU, else CPU,
    with its family, model and speed-relevant instruction sets where the run recorded them, since two virtual
    machines can both call themselves "AMD EPYC") and, with GPUs, how they are linked within a node (NVLink or
    PCIe, from `nvidia-smi topo -m`; a node of one GPU links none, and "PCIe" would read as the GPU's form)."""
    devices = record["devices"]
    nodes = record.get("node_hardware") or [{"devices": {(devices.get("gpus") or [devices["cpu"]])[0]: 1}}]
    models = sorted({model for node in nodes for model in node["devices"]})
    if not devices.get("gpus"):
        return describe_cpu(" + ".join(models), devices.get("cpu_identity") or {})
    if len(devices["gpus"]) == 1 and all(sum(node["devices"].values()) == 1 for node in nodes):
        return " + ".join(models)
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
