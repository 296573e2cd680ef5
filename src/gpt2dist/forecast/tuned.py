"""A tune's calibration as the planner reads it (`gpt2dist recommend --calibration results/tune/calibration.json`):
what the tune measured beside what the planner predicted, split by split, on the cluster it ran on.

A tune times whole splits, not single's step at two micro-batches as `gpt2dist estimate` does, so its correction is
per split: each split's predicted step times its own measured / predicted ratio where the tune measured it, and
times the geometric mean of those ratios (what the planner gets wrong on this cluster in common) where it did not.
For the cluster the tune ran on that puts each measured split at its measurement; for more nodes or a larger size
the ratios are carried over, an assumption the recommendation states. On CPUs the same machine's prediction is the
CPU step model's from the single step the tune timed (forecast.shortlist), which the calibration keeps."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from pydantic import TypeAdapter

from gpt2dist.config.schema import PRECISIONS
from gpt2dist.errors import UsageError
from gpt2dist.forecast.shortlist import Cluster, CpuBasis
from gpt2dist.inputs import read_json

TUNE_KEY = "tune"
# recommend's columns a split's correction scales: its step, the step's terms and the hours they make
SCALED = ("step_ms", "compute_ms", "bubble_ms", "dp_ms", "tp_ms", "pp_ms", "hours", "hours_low", "hours_high",
          "step_s")


@dataclass(frozen=True)
class TunedCalibration:
    """A tune's measured / predicted step per split, the cluster and model it holds for, and where it came from."""

    path: Path
    cluster: Cluster
    preset: str
    size: str | None
    precision: str
    hardware: str
    made_at: str
    basis: CpuBasis | None
    measured_s: dict[str, float]
    predicted_s: dict[str, float]

    @property
    def factors(self) -> dict[str, float]:
        return {name: self.measured_s[name] / self.predicted_s[name] for name in self.measured_s}

    @property
    def typical(self) -> float:
        """The geometric mean of the measured splits' ratios: the correction of a split the tune did not measure."""
        return math.exp(sum(math.log(f) for f in self.factors.values()) / len(self.factors))

    def factor(self, strategy: str) -> tuple[float, str]:
        """A split's correction, and where it comes from."""
        if strategy in self.factors:
            return self.factors[strategy], "measured"
        return self.typical, "typical"

    def applied(self, table: pd.DataFrame) -> pd.DataFrame:
        """A planner's table (recommend's, or forecast.shortlist.predicted's) with each split's step, terms and hours
        corrected, and a `tuned` column saying by what: 'x0.83 measured' or 'x0.95 typical'."""
        table = table.copy()
        said = [self.factor(name) for name in table["strategy"]]
        scale = pd.Series([factor for factor, _ in said], index=table.index)
        for column in SCALED:
            if column in table:
                table[column] = table[column] * scale
        table["tuned"] = [f"x{factor:.2f} {source}" for factor, source in said]
        return table

    def words(self, cluster: Cluster | None = None, size: str | None = None) -> str:
        """How the prediction was calibrated, and what the calibration is carried to beyond what the tune measured."""
        low, high = min(self.factors.values()), max(self.factors.values())
        said = (f"Calibrated by the tune of {self.made_at} ({self.path}) on {self.cluster.words()}, {self.hardware}: "
                f"its {len(self.factors)} measured split(s) took {low:.2f}x to {high:.2f}x their predicted step, each "
                f"multiplied by its own ratio here, the splits it did not measure by {self.typical:.2f} (their "
                "geometric mean)")
        beyond = []
        if cluster is not None and (cluster.nproc, cluster.nodes) != (self.cluster.nproc, self.cluster.nodes):
            beyond.append(f"{cluster.nproc} processes on {cluster.nodes} node(s), the tune ran {self.cluster.nproc} on "
                          f"{self.cluster.nodes}")
        if size != self.size:
            beyond.append(f"model size {size or 'the preset own'}, the tune's {self.size or 'the preset own'}")
        return said + (f"; carried over to {' and '.join(beyond)}, which assumes the ratios hold there." if beyond
                       else ".")


def is_tuned(path: Path) -> bool:
    """Whether a --calibration file is a tune's (else `gpt2dist estimate`'s)."""
    found = read_json(path, "gpt2dist tune or gpt2dist estimate")
    return isinstance(found, dict) and TUNE_KEY in found


def read_tuned(path: Path) -> TunedCalibration:
    """A tune's calibration; refused in one line where it is not what `gpt2dist tune` writes."""
    found = read_json(path, "gpt2dist tune").get(TUNE_KEY)
    try:
        splits = {str(name): (float(split["measured_step_s"]), float(split["predicted_step_s"]))
                  for name, split in found["splits"].items()}
        basis = TypeAdapter(CpuBasis).validate_python(found["basis"]) if found.get("basis") else None
        text, maybe = TypeAdapter(str), TypeAdapter(str | None)
        precision = text.validate_python(found["precision"])
        if precision not in PRECISIONS:
            raise ValueError(f"precision {precision!r}")
        tuned = TunedCalibration(Path(path), Cluster.of(found["cluster"]), text.validate_python(found["preset"]),
                                 maybe.validate_python(found.get("size")), precision,
                                 text.validate_python(found["hardware"]), text.validate_python(found["made_at"]), basis,
                                 {name: measured for name, (measured, _) in splits.items()},
                                 {name: predicted for name, (_, predicted) in splits.items()})
    except (AttributeError, KeyError, TypeError, ValueError, UsageError) as exc:
        raise UsageError(f"--calibration {path}: it is not what `gpt2dist tune` writes ({exc}); run the tune again") \
            from None
    if not splits or not all(0 < value < math.inf for pair in splits.values() for value in pair):
        raise UsageError(f"--calibration {path}: its tune measured no split (or a step that is not a positive time); "
                         "run the tune again where its runs complete")
    if tuned.cluster.device == "cpu" and tuned.basis is None:
        raise UsageError(f"--calibration {path}: a tune on CPUs keeps single's step the CPU step model starts from, "
                         "and this one has none; run the tune again")
    return tuned
