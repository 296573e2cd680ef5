"""What a tune measures (`gpt2dist tune`): every split of the cluster the planner weighs (forecast.splits), each
predicted as the tune will run it, and the short list: the planner's pick, every split it cannot tell apart from
the pick (its own error on the ratio of two runs, as `recommend` decides ties), and the best predicted of each
data-parallel method and of each split shape, so that a measurement can overturn the model. Everything else is
ruled out without running, and why: it cannot run here, it computes exactly as another candidate, it does not fit
in memory, or it is predicted slower than the pick by more than the model's error.

On GPUs a split's step is the GPU step model's (forecast.plan, recommend's), its ratio error the one it shows on
published GPU runs. On CPUs it is the CPU step model's (forecast.prediction: single's step timed on this machine,
shared by the processes on its cores, a pipeline's bubble, each group's bytes at the bus bandwidth of its
processes) and across emulated nodes the link model's (forecast.link_model: the bytes that cross a node's link at
its rate), its ratio error the one the stored CPU studies show (docs/reference, read as `recommend --study` reads
them). Torch-free, and blind to any results but the stored studies' summaries."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace

import pandas as pd
from pydantic import TypeAdapter

from gpt2dist.config.memory import GIB, predict, usable_bytes, with_checkpointed_blocks
from gpt2dist.config.methods import HYBRID, NONE, SHARD
from gpt2dist.config.placement import Placement
from gpt2dist.config.schema import Preset, RunSpec
from gpt2dist.config.split import composed_name
from gpt2dist.config.strategies import REFERENCE, check_run, degrees_of, describe
from gpt2dist.config.traffic import crossing_bytes, traffic
from gpt2dist.errors import UsageError
from gpt2dist.forecast.link_model import link_seconds
from gpt2dist.forecast.plan import gpu_step_terms
from gpt2dist.forecast.prediction import StepTerms, step_terms
from gpt2dist.forecast.published import HIGH, pairs, published_summary
from gpt2dist.forecast.splits import splits_of
from gpt2dist.pipeline.run import Run
from gpt2dist.pipeline.study import planned_spec
from gpt2dist.system.hardware import GPUS, named_in
from gpt2dist.system.links import Links

# The bus bandwidth of gloo's collectives between processes of one machine where no stored study measured one at
# the tune's process count: the stored CPU studies measured 0.24 to 1.23 GB/s at 2 and 4 processes on 2 cores.
ASSUMED_CPU_BUSBW_GB_S = 0.8
LINK = "link"  # the emulated nodes' link, a term of its own beside the groups' (dp, tp, pp)
COLUMNS = ["strategy", "method", "cannot_run", "computes_as", "shape", "step_s", "compute_s", "bubble_s",
           "comm_exposed_s", "comm_hidden_s", "peak_gib", "state_gib", "fits", "fits_checkpointed"]


@dataclass(frozen=True)
class Cluster:
    """Where a tune measures: processes on this machine's CPUs (on one machine, on nodes emulated on it with a shaped
    link, or on a cluster's CPU nodes), or a cluster's GPUs, `gpu` their model, `gpus_per_node` on each of `nodes`."""

    device: str  # "cpu" or "cuda"
    nproc: int  # processes (GPUs) in all
    nodes: int = 1
    emulated: bool = False
    link_mbit: float | None = None  # emulated nodes' link, each way
    gpu: str | None = None
    gpus_per_node: int = 0
    links: Links | None = None  # the GPUs' links inside and across nodes
    memory_gb: float | None = None  # one GPU's, or on CPUs one process's share of the machine's

    def __post_init__(self):
        if self.device not in ("cpu", "cuda"):
            raise UsageError(f"a cluster's device is cpu or cuda, not {self.device!r}")
        if self.device == "cuda" and named_in(self.gpu or "", GPUS) is None:
            raise UsageError(f"{self.gpu!r} names no GPU whose peaks are known (known: {', '.join(GPUS)})")
        if self.device == "cuda" and (self.links is None or not 0 < (self.memory_gb or 0) < math.inf):
            raise UsageError("a GPU cluster has its links and its GPUs' memory")
        if self.nproc < 1 or self.nodes < 1 or self.gpus_per_node < 0:
            raise UsageError(f"a cluster has at least a process and a node, and no fewer than no GPUs: not {self.nproc} "
                             f"process(es) on {self.nodes} node(s) of {self.gpus_per_node} GPUs")
        if self.nproc % self.nodes:
            raise UsageError(f"{self.nproc} processes do not spread evenly over {self.nodes} node(s); give a multiple "
                             f"of the nodes (e.g. --nproc {self.nodes * max(1, self.nproc // self.nodes)})")
        if self.device == "cuda" and self.nproc != self.gpus_per_node * self.nodes:
            raise UsageError(f"a tune on GPUs runs a process per GPU: {self.gpus_per_node} per node on {self.nodes} "
                             f"node(s) are {self.gpus_per_node * self.nodes}, not {self.nproc}")

    @property
    def per_node(self) -> int:
        return self.nproc // self.nodes

    def run(self, strategy: str, precision: str, size: str | None = None, repeat: int = 0) -> Run:
        return Run(strategy, precision, self.nproc, repeat, self.nodes, self.link_mbit, self.emulated, size)

    def placement(self) -> Placement:
        return Placement(self.nproc, self.nodes, self.emulated, self.link_mbit)

    def words(self) -> str:
        """'2 processes on one machine', '4 processes on 2 emulated nodes, 200 Mbit/s', '2 nodes of 8 H100 GPUs
        (nvlink4 ... across nodes)'."""
        if self.device == "cpu":
            return f"{self.placement().words()} (CPUs)"
        return (f"{self.nodes} node(s) of {self.gpus_per_node} {self.gpu} GPUs ({self.memory_gb:g} GB), "
                f"{self.links.words(self.nodes)}")

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def of(cls, said: dict) -> Cluster:
        """A cluster as `as_dict` wrote it (a tune's plan and calibration), its fields' types checked."""
        return TypeAdapter(cls).validate_python(said)


@dataclass(frozen=True)
class CpuBasis:
    """What the CPU step model starts from: single's step of the tune's model timed on this machine, and the bus
    bandwidth of its processes' collectives, with where that came from."""

    single_step_s: float
    busbw_gb_s: float
    busbw_from: str

    def __post_init__(self):
        if not (0 < self.single_step_s < math.inf and 0 < self.busbw_gb_s < math.inf):
            raise UsageError(f"single's step ({self.single_step_s}) and the bus bandwidth ({self.busbw_gb_s}) the CPU "
                             "step model starts from are positive")


def stored_cpu_rows(stored: list) -> pd.DataFrame:
    """The stored CPU studies' configurations beside single (recommend.Stored), each with its study and placement."""
    rows = [row | {"study": s.name, "placement": Placement.of(row).words()}
            for s in stored if s.device == "cpu" for row in s.summary.to_dict("records")
            if row["strategy"] != REFERENCE and row.get("predicted_step_time_s") == row.get("predicted_step_time_s")
            and (row.get("predicted_step_time_s") or 0) > 0]
    return pd.DataFrame(rows)


def cpu_ratio_error(stored: list) -> tuple[float, int]:
    """How far the CPU step model's ratio of two runs of one placement is off in the stored CPU studies (their
    predicted beside measured steps), at its 95th percentile as published GPU runs give the GPU step model's
    (forecast.published.pairs: pairs within a 3% tie left out), and over how many pairs."""
    rows = stored_cpu_rows(stored)
    if rows.empty:
        raise UsageError("no stored CPU study to measure the CPU step model's error on (docs/reference holds them); "
                         "pass --study <a collected CPU study's results directory>")
    frame = pd.DataFrame({"group": rows["study"] + ": " + rows["placement"] + ", " + rows["precision"],
                          "row": rows["config_id"], "gpus": rows["nproc"],
                          "published_tokens_per_s": 1 / rows["step_time_s"],
                          "predicted_tokens_per_s": 1 / rows["predicted_step_time_s"]})
    ordered = pairs(frame)
    return float(ordered["ratio_error"].abs().quantile(HIGH)), len(ordered)


def cpu_bus_bandwidth(stored: list, nproc: int) -> tuple[float, str]:
    """The bus bandwidth of `nproc` processes' collectives on one machine: the median the stored CPU studies measured
    at that count, else at any, else ASSUMED_CPU_BUSBW_GB_S."""
    rows = stored_cpu_rows(stored)
    if not rows.empty:
        rows = rows[(rows["nodes"].fillna(1) == 1) & rows["busbw_gb_s"].notna()]
        for chosen, said in ((rows[rows["nproc"] == nproc], f"at {nproc} processes"), (rows, "at any process count")):
            if len(chosen):
                return (float(chosen["busbw_gb_s"].median()),
                        f"the median of {len(chosen)} one-machine configurations of the stored CPU studies {said}")
    return ASSUMED_CPU_BUSBW_GB_S, "assumed (no stored CPU study measured one)"


def _shape(spec: RunSpec) -> str:
    degrees = degrees_of(spec)
    return composed_name(NONE, degrees.tp, degrees.pp).replace("-", " x ") or "data-parallel only"


def computation(spec: RunSpec) -> tuple:
    """What decides how a split computes and communicates: its engine, its degrees and its method's settings. Two
    splits with the same compute alike (HSDP whose shard groups hold every data-parallel rank is FSDP)."""
    d, degrees = describe(spec.strategy), degrees_of(spec)
    method = d.method
    state = SHARD if method.state == HYBRID and degrees.dp_replicate == 1 else method.state
    return (d.engine.name, d.launcher, state, method.reshard_after_forward, method.reduce_every_micro_step,
            method.optimizer_sharded, method.data_parallel and degrees.dp > 1, degrees.dp_replicate, degrees.dp_shard,
            degrees.tp, degrees.pp, degrees.pp_virtual, degrees.devices_per_process)


def cpu_step_terms(spec: RunSpec, cluster: Cluster, basis: CpuBasis) -> StepTerms:
    """The CPU step model's step of `spec` on `cluster`: single's step shared by the processes on each machine's
    cores, a pipeline's bubble, each group's bytes at the processes' bus bandwidth, and on emulated nodes the bytes
    that cross a node's link at its rate (the link model)."""
    row = {"strategy": spec.strategy, "nproc": spec.nproc, "nodes": 1 if cluster.emulated else cluster.nodes,
           "comm_parts": {part.group: (part.bytes_per_step, basis.busbw_gb_s) for part in traffic(spec).parts}}
    terms = step_terms(row, basis.single_step_s, "cpu", spec.train)
    if cluster.emulated and cluster.link_mbit:
        crossing = link_seconds(crossing_bytes(spec, cluster.nodes), cluster.link_mbit)
        terms = replace(terms, comm_s={**terms.comm_s, LINK: crossing})
    return terms


def predicted(name: str, preset: Preset, cluster: Cluster, precision: str, size: str | None = None,
              basis: CpuBasis | None = None, *, named: list[str] = (),
              unavailable: dict[str, str] | None = None) -> pd.DataFrame:
    """Every split of `cluster` as the tune would run it (the preset's model at `size`, its train settings), the
    `named` ones first (a user's spelling of a split the grammar names otherwise, fsdp-tp2 for fsdp-tp, then stands
    for it), then in the order splits_of lists them: whether it can run here (`cannot_run`, why not: also where
    `unavailable` says what it lacks), the split it computes exactly as (`computes_as`), its method and shape, its
    predicted step and the step's terms, its predicted peak memory and whether that fits. On CPUs `basis` says where
    the CPU step model starts."""
    if cluster.device == "cpu" and basis is None:
        raise UsageError("a CPU tune's predictions start from single's step timed on this machine; none was given")
    model = planned_spec(name, preset, cluster.run(REFERENCE, precision, size), cluster.device).model
    rows, seen = [], {}
    for strategy in dict.fromkeys([*named, *splits_of(cluster.nproc, cluster.per_node, model, preset.train)]):
        row = {"strategy": strategy, "method": describe(strategy).method.name, "cannot_run": "", "computes_as": ""}
        spec = planned_spec(name, preset, cluster.run(strategy, precision, size), cluster.device)
        try:
            check_run(spec, cluster.gpus_per_node)
            if (unavailable or {}).get(strategy):
                raise UsageError(unavailable[strategy])
            terms = gpu_step_terms(spec, cluster.gpu, cluster.links) if cluster.device == "cuda" else \
                cpu_step_terms(spec, cluster, basis)
        except UsageError as refusal:
            rows.append(row | {"cannot_run": str(refusal)})
            continue
        first = seen.setdefault(computation(spec), strategy)
        row["computes_as"] = "" if first == strategy else first
        memory = predict(spec)
        peak = memory.peak
        exposed = terms.exposed_s
        rows.append(row | {
            "shape": _shape(spec), "step_s": terms.total_s, "compute_s": terms.compute_s, "bubble_s": terms.bubble_s,
            "comm_exposed_s": sum(exposed.values()), "comm_hidden_s": terms.hidden_s,
            "peak_gib": peak / GIB, "state_gib": memory.state / GIB,
            "fits": cluster.memory_gb is None or peak <= usable_bytes(cluster.memory_gb),
            "fits_checkpointed": cluster.memory_gb is None
            or predict(with_checkpointed_blocks(spec)).peak <= usable_bytes(cluster.memory_gb)})
    return pd.DataFrame(rows, columns=COLUMNS)


@dataclass
class Shortlist:
    """The candidates a tune measures, most wanted first (what a budget too small for all keeps), with why each is
    there, and the splits it rules out without running, with why."""

    candidates: list[str]
    kept_because: dict[str, str]
    ruled_out: dict[str, str]
    ratio_error: float
    pick: str
    table: pd.DataFrame = field(repr=False)  # `predicted`'s, every split

    def predicted_step_s(self, strategy: str) -> float:
        return float(self.table.set_index("strategy").loc[strategy, "step_s"])


def shortlist(table: pd.DataFrame, ratio_error: float, among: list[str] | None = None) -> Shortlist:
    """The short list from `predicted`'s table: the pick (the fastest predicted that fits), those within
    `ratio_error` of it, the best predicted of each split shape and of each data-parallel method; `among` (split
    names) limits the splits weighed to those. Order: the pick, each shape's best, each method's best, then the
    other ties, each group fastest predicted first."""
    ruled_out = {}
    if among is not None:
        unknown = [name for name in among if name not in set(table["strategy"])]
        if unknown:
            raise UsageError(f"--among {','.join(unknown)}: no split of this cluster has that name (its splits: "
                             f"{', '.join(table['strategy'])})")
        table = table[table["strategy"].isin(among)]
    for row in table.itertuples():
        if row.cannot_run:
            ruled_out[row.strategy] = f"cannot run here: {row.cannot_run}"
        elif row.computes_as:
            ruled_out[row.strategy] = f"computes exactly as {row.computes_as} here (the same engine, degrees and state)"
        elif not row.fits:
            ruled_out[row.strategy] = (f"does not fit in memory: {row.peak_gib:,.1f} GiB predicted at its peak"
                                       + ("; activation checkpointing would make it fit, which a tune does not try"
                                          if row.fits_checkpointed else ""))
    runnable = table[~table["strategy"].isin(list(ruled_out))]
    if runnable.empty:
        raise UsageError("no split of this cluster can run and fit here: "
                         + "; ".join(f"{name}: {why}" for name, why in ruled_out.items()))
    runnable = runnable.sort_values("step_s", kind="stable")
    best = runnable.iloc[0]
    within = best["step_s"] * (1 + ratio_error)
    kept: dict[str, str] = {best["strategy"]: "the planner's pick (the fastest predicted)"}
    for column, words in (("shape", "split shape"), ("method", "data-parallel method")):
        for value, group in runnable.groupby(column, sort=False):
            first = group.iloc[0]["strategy"]
            kept.setdefault(first, f"the best predicted of its {words} ({value})")
    for row in runnable.itertuples():
        if row.step_s <= within:
            kept.setdefault(row.strategy, f"within the model's error of the pick: predicted "
                                          f"{row.step_s / best['step_s']:.2f}x its step, the model's error on the "
                                          f"ratio of two runs {ratio_error:.0%}")
    firsts = {row["strategy"]: row["step_s"] for row in runnable.to_dict("records")}
    order = {"the planner's pick": 0, "the best predicted of its split shape": 1,
             "the best predicted of its data-parallel method": 2, "within the model's error": 3}
    candidates = sorted(kept, key=lambda name: (next(rank for words, rank in order.items()
                                                     if kept[name].startswith(words)), firsts[name]))
    for row in runnable.itertuples():
        if row.strategy not in kept:
            ruled_out[row.strategy] = (f"predicted {row.step_s / best['step_s']:.2f}x the pick's step, beyond the "
                                       f"model's error on the ratio of two runs ({ratio_error:.0%}); its split shape's "
                                       f"best predicted is {_best(runnable, 'shape', row.shape)}, its method's "
                                       f"{_best(runnable, 'method', row.method)}")
    return Shortlist(candidates, kept, ruled_out, ratio_error, best["strategy"], table)


def _best(runnable: pd.DataFrame, column: str, value: str) -> str:
    return runnable[runnable[column] == value].iloc[0]["strategy"]


def gpu_ratio_error() -> float:
    """The GPU step model's error on the ratio of two runs of one machine (its 95th percentile on published runs)."""
    return published_summary(None)["ratio_high_abs_error"]
