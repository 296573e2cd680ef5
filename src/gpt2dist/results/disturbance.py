"""Was a run measured on a quiet machine? One verdict per run, with the reason, from what the
run recorded about its conditions: other processes' share of its CPUs (the launcher's load
monitor), how much CPU time rank 0 got for its threads, how steady its step times were, and on
GPUs whether the device slowed itself for heat or power. Then, over its configuration's repeats,
whether it is an outlier either way: a run far faster than its repeats is as suspect as a slow one
(a quiet spell on a shared machine, a clock boost), and no condition it recorded would show it.

A disturbed run's numbers are not averaged in silently: collect leaves them out of the
statistics and marks them, or refuses the study (study.max_disturbed)."""

from __future__ import annotations

import pandas as pd

from gpt2dist.config.schema import StudyConfig
from gpt2dist.config.strategies import describe
from gpt2dist.system.gpu_telemetry import DISTURBING_REASONS


def step_time_spread(step_times: pd.Series) -> float:
    """Median absolute deviation over median: robust to the odd slow step (a checkpoint, GC),
    not to a machine that was busy for part of the run."""
    median = step_times.median()
    return float((step_times - median).abs().median() / median) if median > 0 else float("nan")


def cpu_share(steady: pd.DataFrame, threads: int | None, attainable: float = 1.0) -> float:
    """Rank 0's CPU time per step over what its compute threads could have used (median), where the machine's
    cores let them have only `attainable` of it (more ranks' threads than cores: 4 ranks of a thread each on 2
    cores get half each, undisturbed)."""
    if "cpu_time_s" not in steady or not threads:
        return float("nan")
    return float((steady["cpu_time_s"] / (steady["step_time_s"] * threads * attainable)).median())


def attainable_share(record: dict, threads: int | None) -> float:
    """The share of its threads' time a rank of this run can get when nothing else runs: its cores (its CPU
    affinity) over the threads of every rank on them, at most 1. The ranks on them: all of the run's on emulated
    nodes (one machine's cores), else those rank 0's host reported."""
    cores = len((record.get("threads") or {}).get("cpu_affinity") or [])
    hosts = record.get("node_hardware") or []
    ranks = record.get("nproc", 1) if record.get("emulated_nodes") else (hosts[0].get("ranks", 1) if hosts else 1)
    if not cores or not threads:
        return 1.0
    return min(1.0, cores / (ranks * threads))


def gpu_slowdown_steps(steady: pd.DataFrame) -> int:
    """Steady steps during which the GPU reported a thermal, power-brake or hardware slowdown."""
    if "clock_event_reasons" not in steady:
        return 0
    reasons = steady["clock_event_reasons"].dropna().astype("int64")
    return int(((reasons & DISTURBING_REASONS) != 0).sum())


def foreign_share_while_steady(conditions: dict, steady: pd.DataFrame) -> float:
    """Mean share of the run's CPUs other processes used during the steady-state steps: the load
    samples whose interval overlaps them (start-up, when the workflow tool itself is busy, is not
    what the numbers measure). All samples where the steps carry no timestamps; NaN without samples."""
    shares, ends = conditions.get("foreign_cpu_share") or [], conditions.get("sample_ends_unix_s") or []
    if not shares:
        return float("nan")
    if "end_unix_s" in steady and len(ends) == len(shares):
        begin = (steady["end_unix_s"] - steady["step_time_s"]).min()
        finish = steady["end_unix_s"].max()
        interval = conditions.get("interval_s", 1.0)
        overlapping = [s for s, end in zip(shares, ends) if end > begin and end - interval < finish]
        shares = overlapping or shares
    return sum(shares) / len(shares)


def conditions_of(record: dict, steady: pd.DataFrame) -> dict:
    """The per-run measures collect tabulates (NaN where the run did not record them)."""
    conditions = record.get("conditions") or {}
    threads = (record.get("threads") or {}).get("torch")
    on_cpu = str((record.get("placement") or {}).get("device", "cpu")).startswith("cpu")
    # pp's stages idle in the pipeline's bubble, and ranks on a shaped link wait for it: by design, not starved
    on_a_shaped_link = bool((record.get("emulated_nodes") or {}).get("link_mbit"))
    judged = on_cpu and not describe(record["strategy"]).idle_by_design and not on_a_shaped_link
    return {
        "foreign_cpu_share": foreign_share_while_steady(conditions, steady),
        "steal_share": conditions.get("steal_share_mean", float("nan")),
        "step_time_spread": step_time_spread(steady["step_time_s"]),
        "cpu_share": cpu_share(steady, threads, attainable_share(record, threads)) if judged else float("nan"),
        "gpu_slowdown_steps": gpu_slowdown_steps(steady),
    }


def disturbance(measures: dict, study: StudyConfig) -> str:
    """Why the run counts as disturbed ('' when it does not): every reason that applies."""
    reasons = []
    if measures["foreign_cpu_share"] > study.max_foreign_cpu_share:  # NaN compares False: not recorded
        reasons.append(f"other processes used {measures['foreign_cpu_share']:.0%} of its CPUs "
                       f"(limit {study.max_foreign_cpu_share:.0%})")
    if measures["cpu_share"] < study.min_cpu_share:
        reasons.append(f"rank 0 got {measures['cpu_share']:.0%} of the CPU time its threads could have "
                       f"(limit {study.min_cpu_share:.0%})")
    if measures["step_time_spread"] > study.max_step_time_spread:
        reasons.append(f"step times spread {measures['step_time_spread']:.0%} around their median "
                       f"(limit {study.max_step_time_spread:.0%})")
    if measures["gpu_slowdown_steps"]:
        reasons.append(f"the GPU slowed itself (thermal/power/hardware) in {measures['gpu_slowdown_steps']} steps")
    return "; ".join(reasons)


def outliers(runs: pd.DataFrame, limit: float) -> pd.Series:
    """Per run, why it is an outlier among its configuration's undisturbed runs ('' when it is not): more than
    `limit` from the median of the others (at least 2), and more than twice as far as they lie from each
    other, so that two repeats which merely disagree are not both thrown out. Leave-one-out medians: robust
    to the outlier itself."""
    reasons = pd.Series("", index=runs.index, dtype=object)
    quiet = runs[runs["disturbed"] == ""]
    for _, group in quiet.groupby("config_id"):
        if len(group) < 3:
            continue
        for index, value in group["tokens_per_s"].items():
            others = group["tokens_per_s"].drop(index)
            centre, spread = others.median(), others.max() / others.min() - 1
            deviation = max(value / centre, centre / value) - 1
            if deviation > limit and deviation > 2 * spread:
                # a ratio either way: "26% slower" flagged past a "30%" limit (1.35x in ratio) read as a mistake
                side = "faster" if value > centre else "slower"
                reasons[index] = (f"an outlier: {deviation + 1:.2f}x {side} than the median of its configuration's "
                                  f"other runs ({centre:,.0f} tokens/s; limit {limit + 1:.2f}x either way)")
    return reasons
