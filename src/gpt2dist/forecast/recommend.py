"""`gpt2dist recommend`: for a described GPU cluster and a preset's model, every split of its GPUs
(forecast.splits.splits_of: each factorisation into data x tensor x pipeline parallel degrees with each
data-parallel method, and the named strategies), each as it is and with activation checkpointing, ranked by
predicted time to train a number of tokens, each with whether it fits in memory, the GPU step model's terms that
decide it (computation, the pipeline's bubble, each group's exposed communication), an interval from the model's
measured error, and what the prediction extrapolates beyond.

The interval spans the 5th to 95th percentile of the GPU step model's out-of-source error on the published GPU
runs (forecast.published: each source predicted with constants fitted to the others), or with --mfu that of the
constant-MFU model on them. Stored studies of ours on GPUs (collected results directories) also correct each
strategy by the median of its measured / predicted steps there, and their leave-one-out error is stated: each
configuration predicted with the correction learned from the other configurations of its strategy. Studies on
CPUs say nothing about GPUs and correct nothing.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from gpt2dist.config.memory import GIB, predict, usable_bytes, with_checkpointed_blocks
from gpt2dist.config.placement import Kind, Placement
from gpt2dist.config.schema import Preset, RunSpec
from gpt2dist.config.strategies import check_run, degrees_of, REFERENCE
from gpt2dist.config.traffic import GROUP_DIMS
from gpt2dist.errors import UsageError
from gpt2dist.forecast.plan import gpu_step_terms
from gpt2dist.forecast.published import WITHIN, published_summary
from gpt2dist.forecast.splits import splits_of
from gpt2dist.inputs import read_csv, read_summary
from gpt2dist.pipeline.run import Run
from gpt2dist.pipeline.study import model_of, planned_spec
from gpt2dist.system.hardware import COMPUTE_DTYPE
from gpt2dist.system.links import Links

RECOMPUTE = (False, True)  # each split as it is, and with activation checkpointing (train.activation_checkpointing)


@dataclass(frozen=True)
class Stored:
    """A collected study: where its runs ran and its summary (with predicted beside measured step times)."""

    name: str
    device: str
    summary: pd.DataFrame

    @property
    def rivals(self) -> pd.DataFrame:
        """Its configurations the step model predicts from single's (single's own is the calibration)."""
        s = self.summary
        return s[(s["strategy"] != REFERENCE) & s["predicted_step_time_s"].notna() & (s["step_time_s"] > 0)]


def read_stored(directories: list[Path]) -> list[Stored]:
    return [Stored(Path(d).name, read_summary(Path(d))["device"],
                   read_csv(Path(d) / "summary.csv", "gpt2dist collect")) for d in directories]


def leave_one_out(stored: list[Stored]) -> pd.DataFrame:
    """Per stored configuration beside single: the model's error with its strategy's correction learned from
    the other configurations (of studies on the same device kind) alone."""
    columns = ["study", "config_id", "strategy", "learned_from", "uncorrected_error", "error"]
    if not stored:
        return pd.DataFrame(columns=columns)
    rows = pd.concat([s.rivals.assign(study=s.name, device=s.device) for s in stored], ignore_index=True)
    ratio = rows["step_time_s"] / rows["predicted_step_time_s"]
    errors = []
    for index, row in rows.iterrows():
        others = ratio[(rows["strategy"] == row["strategy"]) & (rows["device"] == row["device"]) & (rows.index != index)]
        correction = others.median() if len(others) else 1.0
        errors.append({"study": row["study"], "config_id": row["config_id"], "strategy": row["strategy"],
                       "learned_from": len(others), "uncorrected_error": row["step_time_error"],
                       "error": row["predicted_step_time_s"] * correction / row["step_time_s"] - 1})
    return pd.DataFrame(errors, columns=columns)


def extrapolations(stored: list[Stored], gpus: int, nodes: int) -> list[str]:
    """What about the cluster no stored study measured."""
    notes = []
    if not any(s.device == "cuda" for s in stored):
        notes.append("no stored study of ours ran on GPUs: the step is the GPU step model's with constants fitted to "
                     "others' published runs, not corrected by runs of this engine")
    most = max(int(s.summary["nproc"].max()) for s in stored)
    if gpus > most:
        notes.append(f"{gpus} processes, the stored studies ran at most {most}")
    if nodes > 1 and not any(Placement.of(row).kind is Kind.CLUSTER for s in stored for row in s.summary.to_dict("records")):
        notes.append(f"{nodes} real nodes, the stored studies' nodes were emulated on one machine or absent")
    return notes


def gpu_error(mfu: float | None) -> tuple[float, float]:
    """The 5th and 95th percentile of a GPU prediction's throughput error (predicted / published - 1) on the
    published runs: the GPU step model's out of source, or the constant-MFU model's at `mfu`."""
    summary = published_summary(mfu)
    return summary["throughput_low_error"], summary["throughput_high_error"]


def recommend(name: str, preset: Preset, stored: list[Stored], *, gpu: str, gpus_per_node: int, nodes: int,
              precision: str, tokens: float, memory_gb: float, links: Links, size: str | None = None,
              mfu: float | None = None, calibration: dict | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The candidates ranked (fitting first, then by predicted hours; those that cannot run last, saying why) for
    the preset's model at `size` (config.sizes; None: its own), and the stored GPU studies' leave-one-out errors."""
    if gpus_per_node < 1 or nodes < 1:
        raise UsageError(f"--gpus and --nodes count at least 1, got {gpus_per_node} GPUs per node and {nodes} nodes")
    if precision not in COMPUTE_DTYPE:
        raise UsageError(f"--precision '{precision}' is not one of {', '.join(COMPUTE_DTYPE)}")
    if tokens <= 0 or memory_gb <= 0:
        raise UsageError(f"--tokens and --memory-gb are positive; got {tokens:g} and {memory_gb:g}")
    on_gpus = [s for s in stored if s.device == "cuda"]
    errors = leave_one_out(on_gpus)
    measured = pd.concat([s.rivals for s in on_gpus], ignore_index=True) if on_gpus else None
    low, high = gpu_error(mfu)
    n = gpus_per_node * nodes
    model = model_of(preset, size)
    rows = []
    for strategy, recompute in itertools.product(splits_of(n, gpus_per_node, model, preset.train), RECOMPUTE):
        # the preset's micro-batch per GPU sets the global batch; each split runs it at every micro-batch that
        # divides its replicas' rows, with or without activation checkpointing
        run = Run(strategy, precision, n, 0, nodes, size=size)
        spec = planned_spec(name, preset, run, "cuda", weak_scaling=True)
        spec = with_checkpointed_blocks(spec) if recompute else spec
        tokens_per_step = spec.train.global_batch_size * spec.model.n_positions
        try:
            check_run(spec, gpus_per_node)
        except UsageError as exc:
            if not recompute:  # its checkpointed twin is refused alike
                rows.append({"strategy": strategy, "recompute": False, "note": f"cannot run here: {exc}"})
            continue
        for candidate in micro_batches_of(spec, gpus_per_node):
            terms = gpu_step_terms(candidate, gpu, links, mfu, calibration)
            correction = 1.0
            if measured is not None:
                ratios = measured.loc[measured["strategy"] == strategy]
                correction = (ratios["step_time_s"] / ratios["predicted_step_time_s"]).median() if len(ratios) \
                    else 1.0
            hours = tokens / tokens_per_step * terms.total_s * correction / 3600
            peak_bytes = predict(candidate).peak
            exposed, degrees = terms.exposed_s, degrees_of(candidate)
            rows.append({"strategy": strategy, "recompute": recompute,
                         "micro_batch": candidate.train.micro_batch_size,
                         "accumulation": degrees.passes, "gpus": n, "fits": peak_bytes <= usable_bytes(memory_gb),
                         "peak_gib": peak_bytes / GIB, "step_ms": terms.total_s * correction * 1e3,
                         "compute_ms": terms.compute_s * correction * 1e3,
                         "bubble_ms": terms.bubble_s * correction * 1e3,
                         **{f"{group}_ms": exposed.get(group, 0.0) * correction * 1e3 for group in GROUP_DIMS},
                         # a published run's time over its prediction is 1 + the throughput's error
                         "hours": hours, "hours_low": hours * (1 + low), "hours_high": hours * (1 + high),
                         "note": ""})
    table = pd.DataFrame(rows)
    runnable = table[table["note"] == ""].sort_values(["fits", "hours"], ascending=[False, True])
    return pd.concat([runnable, table[table["note"] != ""]], ignore_index=True), errors


def micro_batches_of(spec: RunSpec, visible_gpus: int) -> list[RunSpec]:
    """The run at every micro-batch this engine can run it at: each power of two that divides its replicas' rows
    of the global batch, the rest as gradient accumulation (a pipeline's micro-batches): the largest that fits is
    not always the fastest, as its GEMMs widen while its launches and a pipeline's bubble change."""
    rows = spec.train.global_batch_size // degrees_of(spec).dp
    found = []
    for micro in (2**power for power in range(rows.bit_length())):
        if rows % micro:
            continue
        candidate = spec.model_copy(update={"train": spec.train.model_copy(update={"micro_batch_size": micro})})
        try:
            check_run(candidate, visible_gpus)
        except UsageError:  # fewer micro-batches than a pipeline's stages: torch's schedules refuse it
            continue
        found.append(candidate)
    return found


def label(row) -> str:
    """A candidate's name in prose: its strategy, its micro-batch and accumulation, and whether it recomputes each
    block's activations."""
    batch = (f" at micro-batch {row['micro_batch']:.0f} x {row['accumulation']:.0f}" if "micro_batch" in row
             and row["micro_batch"] == row["micro_batch"] else "")
    return f"{row['strategy']}{batch}{' with activation checkpointing' if row.get('recompute') else ''}"


def verdict_line(fitting: pd.DataFrame, ratio_error: float, measure: str = "") -> str:
    """The answer over the candidates that fit (fastest predicted first): the fastest alone only when every other
    is predicted slower by more than `ratio_error` (how far the model's ratio of two runs on one machine is off, at
    its 95th percentile: the hours' intervals share the machine's error and say how long, not which is faster);
    otherwise every candidate the model cannot tell from it, as a tie, and `measure`, the command that tells the
    tied strategies apart by running them, where one is given."""
    if fitting.empty:
        return "No strategy fits this GPU's memory at any micro-batch."
    best = fitting.iloc[0]

    def hours(row) -> str:
        return f"{row['hours']:,.2f} hours ({row['hours_low']:,.2f} to {row['hours_high']:,.2f})"

    others = fitting.iloc[1:]
    tied = others[others["hours"] <= best["hours"] * (1 + ratio_error)]
    if tied.empty:
        return (f"Fastest that fits: {label(best)}, {hours(best)}, every other predicted slower by more than "
                f"{ratio_error:.0%}, the model's error on the ratio of two runs of one search. {pick_record()}")
    # each strategy once, at its fastest micro-batch: the others at other micro-batches are the same choice
    fastest = fitting.loc[[best.name, *tied.index]].drop_duplicates("strategy")
    names = [label(row) for _, row in fastest.iterrows()]
    return (f"Tied for fastest (the model cannot tell them apart: {len(tied) + 1} configurations within "
            f"{ratio_error:.0%} of {label(best)}, its error on the ratio of two runs of one search; each strategy at "
            "its fastest): " + "; ".join(f"{label(row)}, {hours(row)}" for _, row in fastest.iterrows())
            + (". Choose among them by what else matters (memory, tooling)"
               + (", or measure them on the cluster, in rounds until the measurements tell them apart (the best of "
                  f"each other split shape and method with them):\n\n    {measure}\n\n" if measure else ". ")
               if len(names) > 1 else f". Run {names[0]} at whichever of those micro-batches suits. ")
            + pick_record())


def pick_record() -> str:
    """How the model's picks fared where others measured every candidate (forecast.published's searches)."""
    summary = published_summary()
    return (f"On {summary['searches']} published searches of splits and micro-batches its pick was within "
            f"{WITHIN:.0%} of the measured fastest in {summary['searches_within']} (the fastest in "
            f"{summary['searches_top1']}), {summary['regret_worst']:.2f}x the fastest's step at worst.")
