"""Intervals that stay inside their data's domain, and ratios paired by repeat round.

Throughput, step time and memory are positive and their run-to-run noise is multiplicative
(a disturbed machine halves a run, it does not subtract a constant), so every interval here is
a t-interval on the log scale, mapped back: the centre is the geometric mean and the bounds
can never fall below zero. (A bootstrap percentile interval would also stay positive, but
with the 2-5 repeats a study has it covers far less than its nominal 95%: over three repeats
it is the range of the three, which misses the median one time in four.)

Speedups pair each repeat round of a configuration with the same round of its baseline, so
a slow period that hit both cancels out; the interval of the ratio says whether the
difference from the baseline is distinguishable from noise at all.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from scipy import stats

LEVEL = 0.95
NAN3 = (math.nan, math.nan, math.nan)


def log_interval(values, level: float = LEVEL) -> tuple[float, float, float]:
    """(geometric mean, low, high) of positive values with a t-interval (95% unless `level`) on the log
    scale; the bounds are NaN with fewer than two values, all three with none or a non-positive one."""
    values = np.asarray(pd.Series(values).dropna(), dtype=float)
    if len(values) == 0 or (values <= 0).any():
        return NAN3
    logs = np.log(values)
    centre = math.exp(logs.mean())
    if len(values) < 2:
        return centre, math.nan, math.nan
    if np.ptp(logs) == 0:  # identical values: scipy's scale 0 gives NaN bounds
        return centre, centre, centre
    low, high = stats.t.interval(level, len(logs) - 1, loc=logs.mean(), scale=stats.sem(logs))
    return centre, math.exp(low), math.exp(high)


def paired_ratio(numerator: pd.Series, denominator: pd.Series, level: float = LEVEL) -> tuple[float, float, float, int]:
    """(ratio, low, high, pairs): numerator / denominator per repeat round (both indexed by round),
    over the rounds both have, as a log-scale interval of the per-round ratios."""
    rounds = numerator.dropna().index.intersection(denominator.dropna().index)
    if len(rounds) == 0:
        return (*NAN3, 0)
    ratios = numerator.loc[rounds] / denominator.loc[rounds]
    return (*log_interval(ratios, level), len(rounds))


def ratio_text(value: float, low: float, high: float) -> str:
    """A ratio with its interval, in words where the data gives no number: a reader never sees 'nan'. Two
    decimals, or three or four where two would print a bound that excludes 1 as 1.00 (0.996 is below 1: the
    interval then does not include 1, and its words say so)."""
    if math.isnan(value):
        return "not measured (no undisturbed pair of runs; re-run the disturbed ones)"
    if math.isnan(low) or math.isnan(high):
        return f"{value:.2f} (one undisturbed pair, so no interval; run more repeats)"
    digits = next((d for d in (2, 3) if all(b == 1 or round(b, d) != 1 for b in (low, high))), 4)
    return f"{value:.{digits}f} ({low:.{digits}f} to {high:.{digits}f})"


def verdict(low: float, high: float, pairs: int) -> str:
    """Whether a ratio's interval excludes 1: 'faster', 'slower', or says why it cannot tell."""
    if pairs < 2 or math.isnan(low) or math.isnan(high):
        return "too few repeats"
    if low > 1:
        return "faster"
    if high < 1:
        return "slower"
    return "not distinguishable"
