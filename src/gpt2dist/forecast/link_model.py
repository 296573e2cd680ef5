"""A step across nodes = the same configuration's step on one machine + the bytes its busiest rank
sends per step on the groups that span nodes (config.strategies' traffic: a split's tensor-parallel pairs inside
a node send nothing over it) over the node's link.

On the emulated links the model has no overlap of communication with compute (gloo's threads share
the cores that compute), no latency and no protocol overhead: the simplest model that can be wrong,
and `predicted_vs_measured` says by how much. The planner's GPU step (forecast.plan: the GPU step model, with the
part a strategy overlaps with its computation hidden) projects the papers' presets to GPU clusters (`projection`):
a prediction instead of a measurement, labelled as one wherever it is shown.
"""

from __future__ import annotations

import itertools
import math

import pandas as pd

from gpt2dist.config.placement import Kind, Placement
from gpt2dist.config.schema import Preset
from gpt2dist.config.strategies import check_run, describe, STRATEGIES
from gpt2dist.errors import UsageError
from gpt2dist.pipeline.run import Run
from gpt2dist.pipeline.study import planned_spec
from gpt2dist.forecast.plan import gpu_step_terms
from gpt2dist.system.hardware import COMPUTE_DTYPE
from gpt2dist.system.links import Links

# Data-parallel strategies of a process per GPU, whose collectives span every GPU, so nodes' links carry them
PROJECTED_STRATEGIES = tuple(name for name, d in STRATEGIES.items() if d.data_parallel and not d.one_process)


def link_seconds(bytes_per_step: float, link_mbit: float) -> float:
    return bytes_per_step * 8 / (link_mbit * 1e6)


def predicted_vs_measured(summary: pd.DataFrame) -> pd.DataFrame:
    """Per configuration on shaped emulated links: the model's step time (from the one-machine run of
    the same strategy, precision and process count) beside the measured one, and its relative error."""
    columns = ["config_id", "strategy", "precision", "nproc", "nodes", "link_mbit", "one_machine_step_time_s",
               "modelled_link_s", "predicted_step_time_s", "measured_step_time_s", "measured_step_time_ci_low_s",
               "measured_step_time_ci_high_s", "measured_link_s", "error", "modelled_bytes_per_step",
               "measured_bytes_per_step"]
    if "nodes" not in summary:
        return pd.DataFrame(columns=columns)
    kinds = pd.Series([Placement.of(row).kind for row in summary.to_dict("records")], index=summary.index, dtype=object)
    one_machine = summary.loc[kinds == Kind.ONE_MACHINE].set_index(["strategy", "precision", "nproc"])
    rows = []
    for row in summary.loc[(kinds == Kind.EMULATED) & summary["link_mbit"].notna()].itertuples():
        key = (row.strategy, row.precision, row.nproc)
        if key not in one_machine.index:
            continue
        compute = one_machine.loc[key, "step_time_s"]
        crossing = getattr(row, "crossing_bytes_per_step", math.nan)
        crossing = row.comm_bytes_per_step if math.isnan(crossing) else crossing  # collected before it: all cross
        link = link_seconds(crossing, row.link_mbit)
        rows.append([row.config_id, row.strategy, row.precision, row.nproc, row.nodes, row.link_mbit, compute, link,
                     compute + link, row.step_time_s, row.step_time_s_ci_low, row.step_time_s_ci_high,
                     row.step_time_s - compute, (compute + link) / row.step_time_s - 1, crossing,
                     row.link_bytes_per_step])
    return pd.DataFrame(rows, columns=columns)


def projection(preset_name: str, preset: Preset, *, gpu: str, precision: str, gpus_per_node: int,
               node_counts: list[int], links: Links, sizes: list[str | None] = (None,),
               strategies: tuple[str, ...] = PROJECTED_STRATEGIES, mfu: float | None = None,
               calibration: dict | None = None) -> pd.DataFrame:
    """Projected tokens/s of `strategies` (default: the data-parallel ones; any split, ddp-tp2 say) at
    `gpus_per_node` x each node count and each model size (config.sizes; None: the preset's), weak scaling (each
    GPU keeps the preset's micro-batch, no accumulation): forecast.plan's GPU step (the GPU step model, or compute at
    `mfu` of the GPU's peak), each group's collectives over the link it takes in the cluster's `links`, less what the
    strategy overlaps with its computation."""
    if precision not in COMPUTE_DTYPE:
        raise UsageError(f"--precision '{precision}' is not one of {', '.join(COMPUTE_DTYPE)}")
    if gpus_per_node < 1 or not node_counts or min(node_counts) < 1:
        raise UsageError(f"--gpus-per-node and --nodes count at least 1, got {gpus_per_node} GPUs per node and nodes "
                         f"{','.join(map(str, node_counts))}")
    rows = []
    for strategy in strategies:
        describe(strategy)  # an unknown name is one error line, before anything is projected
    for size, strategy, nodes in itertools.product(sizes, strategies, node_counts):
        n = gpus_per_node * nodes
        spec = planned_spec(preset_name, preset, Run(strategy, precision, n, 0, nodes, size=size), "cuda",
                            weak_scaling=True)
        row = {"size": size or "", "strategy": strategy, "nodes": nodes, "gpus": n}
        try:
            check_run(spec, gpus_per_node)
        except UsageError as exc:
            rows.append(row | {"note": f"not projected: {exc}"})
            continue
        terms = gpu_step_terms(spec, gpu, links, mfu, calibration)
        step_s, tokens_per_gpu = terms.total_s, spec.train.micro_batch_size * spec.model.n_positions
        rows.append(row | {"compute_ms": terms.compute_s * 1e3, "bubble_ms": terms.bubble_s * 1e3,
                           "communication_ms": sum(terms.exposed_s.values()) * 1e3, "step_ms": step_s * 1e3,
                           "tokens_per_s": n * tokens_per_gpu / step_s,
                           "scaling_efficiency": terms.compute_s / step_s, "note": "projection"})
    return pd.DataFrame(rows).assign(preset=preset_name, gpu=gpu, precision=precision, assumed_mfu=mfu)


def worst_error(model: pd.DataFrame) -> float:
    """The largest |error| of predicted_vs_measured's rows; NaN without any."""
    errors = model["error"].abs().dropna() if len(model) else pd.Series(dtype=float)
    return float(errors.max()) if len(errors) else math.nan
