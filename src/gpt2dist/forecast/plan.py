"""`gpt2dist plan`: before anything launches, each configuration's memory per rank and step time, the study's
duration, and what will not fit a GPU's memory.

The model state is counted as collect checks it, to the byte, on every run (forecast/prediction.py);
activations, buffers and GPU step times are estimates (config/memory.py; the GPU step model, forecast/gpu_step.py)
that few GPU runs of ours have checked yet: forecast/published.py holds them to others' measurements, out of
source, and the plan quotes that error.
"""

from __future__ import annotations

import collections
import math
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd
from pydantic import TypeAdapter, ValidationError
from tabulate import tabulate

from gpt2dist.config.memory import GIB, predict, usable_bytes, with_checkpointed_blocks
from gpt2dist.config.schema import PRECISIONS, Preset, RunSpec
from gpt2dist.config.sizes import parameter_count
from gpt2dist.config.strategies import check_run, REFERENCE
from gpt2dist.errors import UsageError
from gpt2dist.pipeline.run import Run
from gpt2dist.pipeline.study import (configurations, pipeline_resume_cases, planned_spec, selftested,
                                     study_precisions, Study)
from gpt2dist.forecast.gpu_step import mfu_step_terms, step_work
from gpt2dist.forecast.implementations import engine_implementation
from gpt2dist.inputs import read_json
from gpt2dist.forecast.prediction import StepTerms
from gpt2dist.forecast.published import shipped_constants
from gpt2dist.system.hardware import GPUS, named_in
from gpt2dist.system.links import Links, links_of

MIB = 2**20
# What a run costs beside its steps on a GPU node: Python, torch, CUDA and the process group start, a checkpoint
# and an evaluation at the end. Measured once: each of the H200's selftests (docs/reference/h200-first-gpu-runs:
# a launch of a 2-layer model for 4 steps, four at a time on 16 cores) took 14 to 25 s, 20 s the median.
GPU_LAUNCH_S = 20.0
# Snakemake's own start, prepare, collect, plot and report: 15 s of the one-GPU study on an H200
# (docs/reference/h200-1gpu), rounded up.
STUDY_FIXED_S = 20.0
# The estimate before the first run (study.time_at_start): on a GPU, three `gpt2dist train` launches per precision
# of the study (a few steps at the preset's batch, then single's at two micro-batches, which calibrate the GPU step
# model). The H200's study spent 169 s on its 12.
TIMING_LAUNCHES_PER_PRECISION, TIMING_LAUNCH_S = 3, 14.0


@dataclass(frozen=True)
class GpuCalibration:
    """The GPU step model held to single's steps timed on one GPU of the cluster (`gpt2dist estimate` there) at two
    micro-batches of one pass a step and, where timed, the preset's own step of accumulated passes, a precision at a
    time: measured = scale x predicted + offset_s, fitted through them (least squares over three), the correction of
    every rank's computation in that precision on that GPU."""

    gpu: str
    precision: str
    micro_batches: tuple[int, int]
    measured_s: tuple[float, float]
    predicted_s: tuple[float, float]
    scale: float
    offset_s: float
    # the preset's own step (measured, predicted): its accumulated passes tell the pass from the step's own part,
    # which two one-pass timings cannot (on an H200 they overshot a two-pass step by 18% in bf16)
    preset_step_s: tuple[float, float] | None = None

    def timings_words(self) -> str:
        """What was timed, measured against predicted."""
        said = (f"at {self.micro_batches[0]} and {self.micro_batches[1]} sequences a step "
                f"({self.measured_s[0] * 1e3:,.1f} and {self.measured_s[1] * 1e3:,.1f} ms against "
                f"{self.predicted_s[0] * 1e3:,.1f} and {self.predicted_s[1] * 1e3:,.1f} predicted)")
        if self.preset_step_s:
            said += (f" and at the preset's own step ({self.preset_step_s[0] * 1e3:,.1f} ms against "
                     f"{self.preset_step_s[1] * 1e3:,.1f})")
        return said

    def corrected(self, terms: StepTerms) -> StepTerms:
        """`terms` with the computation (and the bubble, made of it) as measured here."""
        return replace(terms, compute_s=terms.compute_s * self.scale + self.offset_s,
                       bubble_s=terms.bubble_s * self.scale)


def single_spec(name: str, preset: Preset, precision: str, rows: int) -> RunSpec:
    """The preset's model in one process on a GPU, a pass of `rows` sequences a step: what calibration times."""
    spec = planned_spec(name, preset, Run(REFERENCE, precision, 1, 0), "cuda")
    return spec.model_copy(update={"train": spec.train.model_copy(
        update={"micro_batch_size": rows, "global_batch_size": rows})})


def calibrate_gpu(name: str, preset: Preset, gpu: str, precision: str, measured: dict[int, float],
                  preset_step_s: float | None = None) -> GpuCalibration:
    """The line through the two micro-batches' measured against predicted steps, or with the preset's own step
    (`preset_step_s`, measured) the least-squares line through the three; where the micro-batches' did not grow (the
    model predicts a step the host's dispatch decides, or the timings did not tell the work from a fixed cost), the
    ratio of the sums, without an offset."""
    (small, small_s), (large, large_s) = sorted(measured.items())
    predicted = [gpu_step_seconds(single_spec(name, preset, precision, rows), gpu, links_of(gpu))
                 for rows in (small, large)]
    xs, ys = [*predicted], [small_s, large_s]
    step = None
    if preset_step_s is not None:
        own = planned_spec(name, preset, Run(REFERENCE, precision, 1, 0), "cuda")
        step = (preset_step_s, gpu_step_seconds(own, gpu, links_of(gpu)))
        xs.append(step[1])
        ys.append(step[0])
    scale = offset = 0.0
    if predicted[1] > predicted[0] * 1.001 and large_s > small_s:
        scale, offset = (float(v) for v in np.polyfit(xs, ys, 1))
    if not scale > 0:  # no growth to fit, or a line that falls
        scale, offset = sum(ys) / sum(xs), 0.0
    return GpuCalibration(gpu, precision, (small, large), (small_s, large_s), tuple(predicted), scale, offset, step)


CALIBRATION_KEY = "gpu_calibration"  # estimate.json's
_CALIBRATIONS = TypeAdapter(dict[str, GpuCalibration])  # types checked, numbers as JSON writes them


def read_calibration(path: Path, gpu: str) -> dict[str, GpuCalibration]:
    """The GPU step model's calibration `gpt2dist estimate` wrote on a GPU node, by precision; refused in one line
    where the file holds none, holds one of another shape (a finite positive scale, a finite offset, two of each
    timing and the preset's own step where given, each finite and positive, a precision of this project's) or was
    made on another GPU than `gpu`."""
    found = read_json(path, "gpt2dist estimate")
    found = found.get(CALIBRATION_KEY) if isinstance(found, dict) else None
    if not found:
        raise UsageError(f"--calibration {path}: it holds no GPU calibration; run `gpt2dist estimate` on a GPU node of "
                         "the cluster (it times single's step there)")
    try:
        calibrations = _CALIBRATIONS.validate_python(found)
    except ValidationError:
        calibrations = None
    if not calibrations or any(
            precision != timed.precision or precision not in PRECISIONS or not 0 < timed.scale < math.inf
            or not math.isfinite(timed.offset_s) or len({timed.gpu for timed in calibrations.values()}) > 1
            or not all(0 < seconds < math.inf for seconds in (*timed.measured_s, *timed.predicted_s,
                                                              *(timed.preset_step_s or ())))
            for precision, timed in calibrations.items()):
        raise UsageError(f"--calibration {path}: its GPU calibration is not what `gpt2dist estimate` writes; run it "
                         "again on a GPU node of the cluster")
    timed_on = next(iter(calibrations.values())).gpu
    if named_in(timed_on, GPUS) != named_in(gpu, GPUS):
        raise UsageError(f"--calibration {path} was timed on a {timed_on}, and this plan is for a {gpu}: give --gpu "
                         f"{named_in(timed_on, GPUS)}, or calibrate on a {gpu}")
    return calibrations


def gpu_step_terms(spec: RunSpec, gpu: str, links: Links, mfu: float | None = None,
                   calibration: dict[str, GpuCalibration] | None = None) -> StepTerms:
    """A GPU cluster's step of this engine, term by term: its computation, a pipeline's bubble, and each group's
    communication over the cluster's `links`, less what the strategy sends under its computation. By the GPU step
    model (forecast.gpu_step) with the constants fitted to the published runs (forecast.published), its computation
    corrected where `calibration` (by precision) timed it on this GPU; or, with `mfu`, at that assumed MFU."""
    if mfu is not None:
        return mfu_step_terms(spec, gpu, mfu, links)
    terms = step_work(spec, gpu, engine_implementation(spec), links).terms(shipped_constants())
    measured = (calibration or {}).get(spec.precision)
    return measured.corrected(terms) if measured else terms


def gpu_step_seconds(spec: RunSpec, gpu: str, links: Links, mfu: float | None = None,
                     calibration: dict[str, GpuCalibration] | None = None) -> float:
    """gpu_step_terms' total."""
    return gpu_step_terms(spec, gpu, links, mfu, calibration).total_s


def plan(study: Study, *, gpu: str, memory_gb: list[float], links: Links, sizes: list[str] | None = None,
         mfu: float | None = None, calibration: dict[str, GpuCalibration] | None = None) -> pd.DataFrame:
    """One row per configuration: predicted bytes per rank by part, whether it fits each GPU memory size (with
    the margin) as it is and with activation checkpointing, and on GPUs the step time and the run's training time.
    A study of model sizes has a `size` and `parameters` column; `sizes` (config.sizes) plans every configuration
    at each of those sizes instead of its own, the preset's context and vocabulary kept. A configuration that
    cannot run at a size (heads that do not divide over tensor-parallel ranks) says why in `cannot_run`."""
    if not memory_gb or min(memory_gb) <= 0:
        raise UsageError("--memory-gb lists GPU memory sizes in GB, e.g. 80,40")
    t = study.preset.train
    repeats = collections.Counter(run.config_id for run in study.runs)
    # each configuration without its size: what --sizes plans at each size, with as many repeats as the study's
    bare = {replace(run, size=None).config_id: replace(run, size=None) for run in configurations(study)}
    repeats |= {config: repeats[run.config_id] for run in configurations(study)
                if (config := replace(run, size=None).config_id) not in repeats}
    planned = [replace(run, size=size) for size in sizes for run in bare.values()] if sizes else configurations(study)
    rows = []
    for run in planned:
        row = {"size": run.size, "parameters": parameter_count(study.model(run.size))} if run.size else {}
        row |= {"config_id": run.config_id, "strategy": run.strategy, "precision": run.precision,
                "nproc": run.nproc, "nodes": run.nodes,
                "repeats": repeats.get(run.config_id) or repeats[replace(run, size=None).config_id]}
        try:
            spec = planned_spec(study.preset_name, study.preset, run, study.device)
            check_run(spec, study.gpus)
        except UsageError as refusal:
            rows.append(row | {"cannot_run": str(refusal)})
            continue
        try:
            step = gpu_step_seconds(spec, gpu, links, mfu, calibration) if study.device == "cuda" else math.nan
        except UsageError as refusal:  # a precision this GPU has no arithmetic for
            rows.append(row | {"cannot_run": str(refusal)})
            continue
        row["cannot_run"] = ""
        memory = predict(spec)
        row |= {"state_mib": memory.state / MIB, "activations_mib": memory.activations / MIB,
                "buffers_mib": memory.buffers / MIB, "peak_mib": memory.peak / MIB}
        checkpointed = predict(with_checkpointed_blocks(spec)).peak
        for gb in memory_gb:
            row[f"margin_{gb:g}gb_gib"] = (usable_bytes(gb) - memory.peak) / GIB
            row[f"margin_{gb:g}gb_checkpointed_gib"] = (usable_bytes(gb) - checkpointed) / GIB
        row |= {"step_ms": step * 1e3, "run_min": step * t.max_steps / 60}
        rows.append(row)
    return pd.DataFrame(rows)


def study_seconds(study: Study, table: pd.DataFrame) -> dict[str, float]:
    """The study's duration on its GPUs, job after job as the pipeline runs them there: every run's steps
    (table's run_min), a launch per run and per selftest (three for one that kills and resumes), the estimate's
    timing of the model before the first run, and the fixed part; by part, and in all ("total")."""
    resumed = {run.config_id for run in pipeline_resume_cases(study)}
    launches = len(study.runs) + sum(1 + 2 * (run.config_id in resumed) for run in selftested(study))
    timed = len(study_precisions(study)) * TIMING_LAUNCHES_PER_PRECISION * study.preset.study.time_at_start
    parts = {"steps": float((table["run_min"] * table["repeats"]).sum() * 60), "launches": launches * GPU_LAUNCH_S,
             "timing": timed * TIMING_LAUNCH_S, "fixed": STUDY_FIXED_S}
    return {**parts, "total": sum(parts.values()), "launch_count": launches, "timing_launches": timed}


def duration_words(study: Study, duration: dict[str, float], budget_s: float | None = None) -> str:
    """study_seconds said in one sentence, with the budget it is within, if one was given."""
    runs = len(study.runs)
    launches = (f"{runs} launches, one per run," if duration["launch_count"] == runs
                else f"{duration['launch_count']:.0f} launches ({runs} for runs, the rest for selftests)")
    within = f"; within --budget-s {budget_s:g}" if budget_s is not None else ""
    total = duration["total"]
    said = f"{total:,.0f} s" if total < 600 else f"{total / 60:,.0f} min" if total < 3 * 3600 else f"{total / 3600:,.1f} hours"
    timing = (f"{duration['timing']:,.0f} s to time the model first ({duration['timing_launches']} launches), "
              if duration["timing_launches"] else "")
    return (f"The study, one job at a time: about {said}: {duration['steps']:,.0f} s of training "
            f"steps, {launches} at about {GPU_LAUNCH_S:.0f} s each (measured on an H200), "
            f"{timing}and {duration['fixed']:.0f} s to prepare, collect, plot and report{within}.")


def plan_text(table: pd.DataFrame, memory_gb: list[float]) -> str:
    """The plan for a terminal of 100 columns: memory in GiB (MiB for a model under one GiB) to one decimal, the
    spare memory per GPU size given (none on CPUs), step and run times on GPUs. Columns that say nothing are left
    out: the runs per configuration where every configuration has as many (the heading says it), buffers
    where no configuration has a twentieth of the unit of them."""
    unit, scale = ("GiB", 1024) if table["peak_mib"].max() >= 1024 else ("MiB", 1)
    shown = pd.DataFrame({"config": table["config_id"]})
    if table["repeats"].nunique() > 1:
        shown["runs"] = table["repeats"]
    shown[f"state\n{unit}"], shown[f"activ.\n{unit}"] = table["state_mib"] / scale, table["activations_mib"] / scale
    if (table["buffers_mib"] / scale >= 0.05).any():
        shown[f"buffers\n{unit}"] = table["buffers_mib"] / scale
    shown[f"peak\n{unit}"] = table["peak_mib"] / scale
    for size in memory_gb:
        shown[f"spare\n{size:g}GB"] = table[f"margin_{size:g}gb_gib"]
    if memory_gb:
        shown["step\nms"], shown["run\nmin"] = table["step_ms"], table["run_min"]
    return tabulate(shown, headers="keys", tablefmt="simple", showindex=False, floatfmt=",.1f")


def fit_lines(table: pd.DataFrame, memory_gb: list[float]) -> list[str]:
    """Per GPU memory size: the configurations that overflow it with their shortfall, and whether activation
    checkpointing would make them fit; else the tightest fit. Then those that cannot run, and why."""
    lines = []
    ran = table[table["cannot_run"] == ""] if "cannot_run" in table else table
    for gb in memory_gb:
        margin = ran[f"margin_{gb:g}gb_gib"]
        over = ran.assign(margin=margin, checkpointed=ran[f"margin_{gb:g}gb_checkpointed_gib"])[margin < 0]
        if len(over):
            named = ", ".join(f"{row.config_id} ({-row.margin:.1f} GiB over{_checkpointed_words(row.checkpointed)})"
                              for row in over.itertuples())
            lines.append(f"will not fit a {gb:g} GB GPU: {named}")
        elif len(ran):
            tightest = margin.idxmin()
            lines.append(f"every configuration fits a {gb:g} GB GPU; the tightest, {ran.loc[tightest, 'config_id']}, "
                         f"with {margin[tightest]:.1f} GiB to spare")
    if "cannot_run" in table:
        lines += [f"cannot run {row.config_id}: {row.cannot_run}" for row in table.itertuples() if row.cannot_run]
    return lines


def _checkpointed_words(margin: float) -> str:
    if margin >= 0:
        return f"; with train.activation_checkpointing=block it fits, {margin:.1f} GiB to spare"
    return f"; {-margin:.1f} GiB over with activation checkpointing too"
