"""Time to a target validation loss beside throughput, and energy per token where the GPU reports its power.

Throughput alone rewards a strategy whose speed comes from changed numerics (fp16, Apex, FSDP's mixed
precision) even when it needs more steps to learn as much. So each run is also timed to the first evaluation
at or below a target validation loss (study.target_val_loss; by default 1% above the worst final validation
loss of single's fp32 runs, which every reference run reaches), and each configuration's steps to that target are
compared with single's fp32 runs by a one-sided Welch t-test, the kind of check MLPerf applies to a
submission's convergence against its reference convergence points: "needs more steps" is said only where the
test says so at the 5% level (or, with no spread on either side, where every repeat needed more).
"""

from __future__ import annotations

import math
import warnings

import pandas as pd
from scipy import stats

from gpt2dist.config.strategies import REFERENCE

REFERENCE_PRECISION = "fp32"
ALPHA = 0.05
# The default target sits this far above the worst final validation loss of single's fp32 runs, as MLPerf's
# targets sit above where its references converge: a run that learns as well, up to rounding, reaches it at the
# same evaluation, and one that does not reach it at all says so.
TARGET_MARGIN = 0.01


def reference_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """The rows of single's fp32 runs, which the target and the numerics check measure against."""
    return frame[(frame["strategy"] == REFERENCE) & (frame["precision"] == REFERENCE_PRECISION)]


def target_loss(table: pd.DataFrame, stated: float | None) -> float:
    """The stated target, else TARGET_MARGIN above the worst final validation loss of single's fp32 runs in the
    study's tidy table (NaN without any)."""
    if stated is not None:
        return stated
    finals = reference_rows(table).dropna(subset=["val_loss"]).sort_values("step").groupby("run_id")["val_loss"].last()
    return float(finals.max()) * (1 + TARGET_MARGIN) if len(finals) else math.nan


def to_target(run: pd.DataFrame, target: float) -> tuple[float, float]:
    """(steps, seconds of training) until the first evaluation at or below `target`; NaN where none is."""
    reached = run[run["val_loss"] <= target]
    if math.isnan(target) or reached.empty:
        return math.nan, math.nan
    steps = int(reached["step"].min())  # an evaluation at step k: the weights after k updates
    return steps, float(run.loc[run["step"] < steps, "step_time_s"].sum())


def energy_per_token(run: pd.DataFrame, nproc: int, tokens_per_step: float) -> float:
    """Joules per token over the run's steps: rank 0's GPU power at each step's end times the step's time,
    for every GPU of the run (each assumed to draw as rank 0's does). NaN without power readings (CPUs)."""
    if "power_w" not in run or run["power_w"].isna().all():
        return math.nan
    steps = run.dropna(subset=["power_w", "step_time_s"])
    return float((steps["power_w"] * steps["step_time_s"]).sum() * nproc / (tokens_per_step * len(steps)))


def needs_more_steps(steps: pd.Series, reference: pd.Series) -> str:
    """'' when the configuration reaches the target in no more steps than single fp32, as far as its repeats
    tell; else what says it needs more. A repeat that never reached the target needed more than it had."""
    missed = int(steps.isna().sum())
    if missed and reference.notna().all() and len(reference):
        return f"{missed} of {len(steps)} repeats did not reach the target"
    steps, reference = steps.dropna(), reference.dropna()
    if steps.empty or reference.empty or steps.mean() <= reference.mean():
        return ""
    if len(steps) > 1 and len(reference) > 1 and (steps.std() > 0 or reference.std() > 0):
        with warnings.catch_warnings():  # a side whose repeats agree exactly is fine for Welch's test; scipy
            warnings.simplefilter("ignore", RuntimeWarning)  # warns of cancellation in computing its zero variance
            p = stats.ttest_ind(steps, reference, equal_var=False, alternative="greater").pvalue
        return f"needs more steps than single fp32 (one-sided p = {p:.3f})" if p < ALPHA else ""
    return "needs more steps than single fp32 (every repeat)" if steps.min() > reference.max() else ""
