"""Every parallel strategy described once, without torch: how it is launched, its degrees for a process count
(config.degrees), the extras it needs, the combinations it refuses, the bytes it moves per step on each of its
process groups and how many of them it sends while it computes, and what the papers call it. Config, planning,
preflight, doctor, selftest, findings and the CLI ask this registry; its runtime half, under
training/strategies/, binds each data-parallel method's behaviour.

A strategy is a split of the devices (config.split): a data-parallel method, how the data-parallel ranks hold the
state (a `Method` here), and tensor- and pipeline-parallel degrees. Its description composes the two: the
parameters a rank holds are its pipeline stage's, tensor-parallel slices of them, then the method's share; its
traffic is the method's collectives on those parameters over the data-parallel group, tensor parallelism's
activation all-reduces over its group and the pipeline's boundary sends. The twelve named strategies are points
of the same grammar (`tp` is one replica split by layer over every process, `fsdp-tp` FSDP over
tensor-parallel groups of train.tensor_parallel_size ranks).

Adding a data-parallel method: one Method here (listed in METHODS), its name in config.split, one runtime class
under training/strategies/, and its equivalence, resume and bad-input tests.
"""

from __future__ import annotations

import functools
import heapq
import math
from dataclasses import dataclass
from typing import ClassVar

from gpt2dist.config.degrees import Degrees
from gpt2dist.config.schema import INTERLEAVED_SCHEDULES, ModelConfig, RunSpec, TrainConfig
from gpt2dist.config.sizes import COLUMN_PARALLEL, ROW_PARALLEL, parameter_count, parameter_shapes, weight_decayed
from gpt2dist.config.split import NAMED, NONE, Split, composed_name, parse_split
from gpt2dist.errors import UsageError

BAI, PATWARDHAN = "Bai 2022", "Patwardhan et al. 2024"
FP32, HALF = 4, 2  # bytes per element
APEX_PRECISIONS = ("apex-O1", "apex-O2")
# Horovod's fusion buffer (HOROVOD_FUSION_THRESHOLD): 0.28's horovod/common/operations.cc sets 128 MiB by default,
# though its tensor-fusion docs still say 64 MB
HOROVOD_FUSION_BYTES = 128 * 2**20
DDP_BUCKET_BYTES = 25 * 2**20  # DistributedDataParallel's bucket_cap_mb default
HEAD = "lm_head.weight"  # the last pipeline stage's copy of the tied token embedding


@dataclass(frozen=True)
class Extra:
    """An optional dependency some strategies or precisions need, and where to get it."""

    module: str
    name: str
    source: str  # what to do to get it
    instead: str  # what runs without it


EXTRAS = {
    "horovod.torch": Extra("horovod.torch", "Horovod", "install it with containers/install_horovod.sh",
                           "--strategy ddp"),
    "apex.amp": Extra("apex.amp", "NVIDIA Apex (apex.amp)",
                      "run inside the gpt2dist container image (containers/), which builds it",
                      "--precision fp16 for native AMP"),
    "apex.parallel": Extra("apex.parallel", "NVIDIA Apex (apex.parallel)",
                           "run inside the gpt2dist container image (containers/), which builds it", "--strategy ddp"),
}
PRECISION_EXTRAS = {precision: ("apex.amp",) for precision in APEX_PRECISIONS}


@dataclass(frozen=True)
class Collective:
    """The bytes the busiest rank sends per optimizer step on one of its process groups."""

    group: str  # the mesh dimension whose ranks it runs over: "dp", "tp" or "pp"
    ranks: int
    bytes_per_step: float
    what: str
    kind: str = "all-reduce"  # as NCCL runs it: all-reduce, all-gather, reduce-scatter or send (system.links)
    calls: float = 1.0  # collectives per step, each paying a latency


@dataclass(frozen=True)
class Traffic:
    """Bytes the busiest rank sends per optimizer step, by an analytic model (not measured), in all and by group."""

    bytes_per_step: int
    pattern: str
    parts: tuple[Collective, ...] = ()


@dataclass(frozen=True)
class Overlap:
    """The part of a step's traffic a strategy sends while its GPUs compute, and how much of the step's computation
    can cover it (a share of it): on GPUs, communication beyond that cover is what the step waits for."""

    bytes_per_step: float
    under: float


NO_OVERLAP = Overlap(0.0, 0.0)
# Backward's share of a step's FLOPs: 4 of every 6 per parameter and token (forward 2)
BACKWARD_SHARE = 2 / 3
# The mesh dimensions a collective group spans; the data-parallel group's is the part that can hide under compute
DATA_PARALLEL_GROUP = "dp"
GROUP_DIMS = {DATA_PARALLEL_GROUP: ("dp_replicate", "dp_shard"), "tp": ("tp",), "pp": ("pp",)}


def root_elements(m: ModelConfig) -> int:
    """Parameters outside the blocks: the embeddings and the final layer norm (FSDP's root module holds them)."""
    return sum(math.prod(shape) for name, shape in parameter_shapes(m).items() if not name.startswith("transformer.h."))


def root_share(spec: RunSpec) -> float:
    """The root's share of the parameters: their gradient is complete only when backward reaches the input (the
    head shares wte), and FSDP gathers them first and reduces them last, so their traffic never runs under
    compute."""
    return root_elements(spec.model) / parameter_count(spec.model)


def gradient_bytes(precision: str) -> int:
    """Bytes per gradient element: O2's model, and so its gradients, are fp16; every other precision keeps fp32."""
    return HALF if precision == "apex-O2" else FP32


def ring_all_reduce(size: float, n: int) -> float:
    """Bytes one rank sends in a ring all-reduce of `size` bytes over n ranks."""
    return 2 * (n - 1) / n * size


def ring_gather(size: float, n: int) -> float:
    """Bytes one rank sends in a ring all-gather or reduce-scatter of a full tensor of `size` bytes."""
    return (n - 1) / n * size


def first_chunk(shape: tuple[int, ...], ranks: int) -> tuple[int, ...]:
    """Rank 0's piece of a tensor split along dim 0 into `ranks` chunks (torch.chunk's sizes, as FSDP2's Shard(0)
    cuts it): the first piece is the largest."""
    return (-(-shape[0] // ranks), *shape[1:])


def stage_blocks(n_layer: int, stages: int) -> list[range]:
    """Contiguous blocks per pipeline stage, the first stages taking one more where they do not divide evenly."""
    base, extra = divmod(n_layer, stages)
    bounds = [0]
    for stage in range(stages):
        bounds.append(bounds[-1] + base + (stage < extra))
    return [range(lo, hi) for lo, hi in zip(bounds, bounds[1:])]


def pipeline_stage_blocks(n_layer: int, ranks: int, virtual: int) -> list[range]:
    """Every stage's blocks in the pipeline's order, `ranks` x `virtual` stages; stage s runs on pipeline rank
    s % ranks."""
    return stage_blocks(n_layer, ranks * virtual)


def rank_blocks(spec: RunSpec, stage_rank: int) -> list[int]:
    """The blocks a pipeline rank (its coordinate along pp) holds: those of stages stage_rank, stage_rank + pp, ..."""
    degrees = degrees_of(spec)
    stages = pipeline_stage_blocks(spec.model.n_layer, degrees.pp, degrees.pp_virtual)
    return [block for blocks in stages[stage_rank::degrees.pp] for block in blocks]


def stage_parameters(spec: RunSpec, rank: int = 0) -> dict[str, tuple[int, ...]]:
    """The parameter tensors `rank`'s pipeline stages hold, whole, by name: every one without a pipeline; else the
    blocks of its stages, the embeddings on the first and ln_f with the head's copy of the tied embedding on the
    last (training/strategies/pipeline_parallel.py's RankPart)."""
    shapes, degrees = parameter_shapes(spec.model), degrees_of(spec)
    if degrees.pp == 1:
        return shapes
    stage = degrees.coordinates(rank)["pp"]
    first, last = stage == 0, stage == degrees.pp - 1
    blocks = tuple(f"transformer.h.{block}." for block in rank_blocks(spec, stage))
    held = {name: shape for name, shape in shapes.items()
            if name.startswith(blocks) or (first and name.startswith(("transformer.wte.", "transformer.wpe.")))
            or (last and name.startswith("transformer.ln_f."))}
    if last and not first:
        held[HEAD] = shapes["transformer.wte.weight"]
    return held


def tensor_parallel_slice(name: str, shape: tuple[int, ...], tp: int) -> tuple[int, ...]:
    """A parameter's local shape under tensor parallelism: column-parallel tensors split their rows, row-parallel
    ones their columns (config.sizes); the rest stays whole on every rank of the group."""
    rows, *rest = shape
    if name.endswith(COLUMN_PARALLEL):
        rows //= tp
    elif name.endswith(ROW_PARALLEL):
        rest = [rest[0] // tp]
    return (rows, *rest)


def local_parameters(spec: RunSpec, rank: int = 0) -> dict[str, tuple[int, ...]]:
    """What `rank` computes with: its stages' parameters, tensor-parallel slices of them (before any sharding of
    the data-parallel method)."""
    tp = degrees_of(spec).tp
    return {name: tensor_parallel_slice(name, shape, tp) for name, shape in stage_parameters(spec, rank).items()}


def local_elements(spec: RunSpec) -> int:
    """Elements of rank 0's local parameters: what its data-parallel collectives move."""
    return sum(math.prod(shape) for shape in local_parameters(spec).values())


def gathered_bytes(spec: RunSpec) -> int:
    """FSDP's gathered parameters at the peak. Without a pipeline: the root's (embeddings and ln_f, kept after
    forward) and two blocks' (the one computing and the one prefetched), each rank's tensor-parallel slice of them.
    Under a pipeline every stage keeps its blocks gathered through the step (their micro-batches come one after
    another): all of rank 0's local parameters."""
    degrees = degrees_of(spec)
    if degrees.pp > 1:
        return local_elements(spec) * gathered_bytes_per_element(spec)
    block = sum(math.prod(shape) for name, shape in parameter_shapes(spec.model).items()
                if name.startswith("transformer.h.0."))
    return round((root_elements(spec.model) + 2 * block) * FP32 / degrees.tp)


def gathered_bytes_per_element(spec: RunSpec) -> int:
    """Bytes per parameter element FSDP2 gathers: 16 bits under train.fsdp_mixed_precision, else fp32."""
    return HALF if spec.train.fsdp_mixed_precision else FP32


def compute_bytes(precision: str) -> int:
    """Bytes per activation element in the precision's compute dtype (16-bit under autocast and Apex amp)."""
    return HALF if precision in ("bf16", "fp16", *APEX_PRECISIONS) else FP32


def activation_bytes(spec: RunSpec, rows: int) -> int:
    """The hidden states [rows, context, width] of `rows` sequences in the precision's compute dtype."""
    m = spec.model
    return rows * m.n_positions * m.n_embd * compute_bytes(spec.precision)


# -- data-parallel methods ----------------------------------------------------------------------------------------

class Method:
    """How the data-parallel ranks hold the model state and how their gradients meet. Defaults: one process per
    device, each holding the whole state (replicated), gradients all-reduced."""

    name: ClassVar[str]
    launcher: ClassVar[str] = "torchrun"  # "python": one process drives every device of the run
    data_parallel: ClassVar[bool] = True  # each rank computes the gradient of its own share of the batch
    shards_state: ClassVar[bool] = False  # parameters, gradients and optimizer state are sharded over the dp ranks
    cuda_only: ClassVar[bool] = False
    accepts_apex: ClassVar[bool] = True  # Apex amp can patch its model and optimizer
    extras: ClassVar[tuple[str, ...]] = ()  # keys of EXTRAS
    options: ClassVar[dict[str, str]] = {}  # train.* switches of this method alone -> when they apply

    def split(self, dp: int, train: TrainConfig) -> dict:
        """The data-parallel degrees of `dp` ranks (and, for DataParallel, the devices one process drives)."""
        return {"dp_replicate": dp}

    def check(self, spec: RunSpec, visible_gpus: int) -> None:
        """Refuse what this method cannot run with the precision and device, naming the key and what is allowed."""

    def held(self, shape: tuple[int, ...], degrees: Degrees) -> tuple[int, ...]:
        """Rank 0's part of a local parameter: the whole of it unless the method shards it."""
        return shape

    def optimizer_shapes(self, spec: RunSpec, held: list[tuple[int, ...]], rank: int) -> list[tuple[int, ...]]:
        """The parameter tensors whose AdamW state `rank` holds: those it holds."""
        return held

    def busiest_rank(self, spec: RunSpec) -> int:
        """The rank holding the most model state: rank 0 unless the optimizer's partition says otherwise."""
        return 0

    def buffer_bytes(self, spec: RunSpec) -> int:
        """Device memory its communication takes beyond the model state (an estimate): none, since DDP's buckets
        are the gradients themselves (gradient_as_bucket_view)."""
        return 0

    def traffic(self, spec: RunSpec, elements: int, degrees: Degrees) -> tuple[float, str]:
        """Bytes rank 0 sends per step over the data-parallel group for `elements` local parameters, and how."""
        return ring_all_reduce(elements * gradient_bytes(spec.precision), degrees.dp), "gradient all-reduce, once per step"

    def calls(self, spec: RunSpec, elements: int, degrees: Degrees) -> tuple[str, float]:
        """The collectives of that traffic per step, as NCCL's kind and a count: the gradients all-reduced in DDP's
        buckets."""
        return "all-reduce", math.ceil(elements * gradient_bytes(spec.precision) / DDP_BUCKET_BYTES)

    def overlap(self, spec: RunSpec, elements: int, degrees: Degrees) -> Overlap:
        """The gradient all-reduce runs bucket by bucket as backward produces them (DDP's buckets, Horovod's and
        Apex's hooks) under the last pass's backward (the others skip it), all but the embeddings' bucket. A
        pipeline's stages reduce after their last micro-batch, exposed."""
        if degrees.pp > 1:
            return NO_OVERLAP
        reduced = ring_all_reduce(elements * gradient_bytes(spec.precision) * (1 - root_share(spec)), degrees.dp)
        return Overlap(reduced, BACKWARD_SHARE / degrees.passes)


class SingleMethod(Method):
    name = "single"
    launcher = "python"
    data_parallel = False

    def check(self, spec, visible_gpus):
        if spec.nproc != 1:
            raise UsageError(f"strategy 'single' runs one process; got --nproc {spec.nproc} (use ddp, fsdp or horovod)")


class DataParallelMethod(Method):
    name = "dp"
    launcher = "python"

    def split(self, dp, train):
        return {"dp_replicate": dp, "devices_per_process": dp}  # one process reads and scatters every share

    def check(self, spec, visible_gpus):
        limit = max(visible_gpus, 1)
        if spec.nproc > limit:
            raise UsageError(f"strategy 'dp' drives one device per --nproc; {spec.nproc} requested but "
                             f"{visible_gpus} CUDA GPUs are visible (use --nproc {limit})")
        if spec.precision == "apex-O2":
            # O2 patches forward on the model object; DataParallel's replicas copy that bound
            # method and so all run the cuda:0 model.
            raise UsageError("precision 'apex-O2' patches the model's forward, which DataParallel replicas would "
                             "share with cuda:0; use dp with apex-O1, or ddp with apex-O2")

    def traffic(self, spec, elements, degrees):
        if spec.device != "cuda":
            return 0.0, "none: DataParallel without CUDA runs on one device"
        sent = 2 * (spec.nproc - 1) * elements * FP32 * degrees.grad_accum_steps
        return sent, "parameters broadcast from and gradients reduced to GPU 0, every micro-step"

    def calls(self, spec, elements, degrees):
        """Copies from GPU 0 and back, coalesced as DDP's buckets are, each a hop."""
        return "send", 2 * degrees.grad_accum_steps * math.ceil(elements * FP32 / DDP_BUCKET_BYTES)

    def overlap(self, spec, elements, degrees):
        """One process broadcasts before and reduces after each micro-step's computation."""
        return NO_OVERLAP


class DDPMethod(Method):
    name = "ddp"

    def buffer_bytes(self, spec):
        """In a split the replicas are FSDP2's replicate-only groups (training/strategies/ddp.py), which gather
        each block as FSDP does."""
        return gathered_bytes(spec) if describe(spec.strategy).splits_model else 0


class ZeRO1Method(DDPMethod):
    name = "zero1"
    accepts_apex = False

    def optimizer_shapes(self, spec, held, rank):
        shares = self.partition(spec)
        return shares[rank] if rank < len(shares) else []

    def busiest_rank(self, spec):
        """Not always rank 0: GPT-2 medium over 4 ranks leaves 0.96% more elements with another."""
        held = [sum(math.prod(shape) for shape in shapes) for shapes in self.partition(spec)]
        return held.index(max(held))

    @staticmethod
    def partition(spec: RunSpec) -> list[list[tuple[int, ...]]]:
        """The shares of ZeroRedundancyOptimizer's partition, rank by rank: per parameter group, largest tensor
        first, each tensor whole to the rank holding the fewest elements so far. Ranks past the list hold none:
        with more ranks than tensors, each tensor goes to an empty rank of its own, the lowest-numbered, so a
        planner asking about a million ranks (or 10^11: recommend --gpus took 12 GB) counts only as many."""
        shapes = list(parameter_shapes(spec.model).values())
        ranks = min(spec.nproc, len(shapes))
        shares: list[list[tuple[int, ...]]] = [[] for _ in range(ranks)]
        # (elements held, rank): the heap's top is the emptiest rank, the lowest-numbered among equals, as
        # torch's sizes.index(min(sizes)) picks it, in log time
        emptiest = [(0, rank) for rank in range(ranks)]
        for decayed in (True, False):  # the loop's two groups, in its order
            for shape in sorted((s for s in shapes if weight_decayed(len(s)) == decayed), key=math.prod, reverse=True):
                held, rank = emptiest[0]
                heapq.heapreplace(emptiest, (held + math.prod(shape), rank))
                shares[rank].append(shape)
        return shares

    def traffic(self, spec, elements, degrees):
        n = degrees.dp
        sent = ring_all_reduce(elements * gradient_bytes(spec.precision), n) + ring_gather(elements * FP32, n)
        return sent, "gradient all-reduce, then each rank's updated parameters broadcast, once per step"

    def calls(self, spec, elements, degrees):
        """DDP's buckets, then a broadcast from each rank of its share."""
        return "all-reduce", super().calls(spec, elements, degrees)[1] + degrees.dp


class HorovodMethod(Method):
    name = "horovod"
    launcher = "horovodrun"
    extras = ("horovod.torch",)

    def buffer_bytes(self, spec):
        return HOROVOD_FUSION_BYTES

    def calls(self, spec, elements, degrees):
        """Gradients fused into buffers of HOROVOD_FUSION_BYTES."""
        return "all-reduce", math.ceil(elements * gradient_bytes(spec.precision) / HOROVOD_FUSION_BYTES)

    def overlap(self, spec, elements, degrees):
        """Under Apex O2 the model's cast to fp16 replaces the gradients Horovod hooked, and every gradient is
        reduced after backward (training/strategies/horovod.py)."""
        return NO_OVERLAP if spec.precision == "apex-O2" else super().overlap(spec, elements, degrees)


class ApexDDPMethod(Method):
    name = "apex-ddp"
    cuda_only = True
    extras = ("apex.parallel",)

    def check(self, spec, visible_gpus):
        if spec.device != "cuda":
            raise UsageError("strategy 'apex-ddp' (apex.parallel.DistributedDataParallel) needs CUDA GPUs; on CPU "
                             "use ddp")
        if spec.precision in ("fp16", "bf16"):
            raise UsageError(f"strategy 'apex-ddp' pairs with Apex amp (apex-O1, apex-O2) or fp32, not torch.amp's "
                             f"{spec.precision}; use ddp for {spec.precision}")


class FSDPMethod(Method):
    name = "fsdp"
    shards_state = True
    accepts_apex = False
    options = {"fsdp_mixed_precision": "with --precision bf16 or fp16"}

    def split(self, dp, train):
        return {"dp_shard": dp}

    def check(self, spec, visible_gpus):
        if spec.train.fsdp_mixed_precision and spec.precision not in ("bf16", "fp16"):
            raise UsageError(f"train.fsdp_mixed_precision applies to --strategy {spec.strategy} "
                             f"{self.options['fsdp_mixed_precision']}, not {spec.strategy} with {spec.precision}; set "
                             "train.fsdp_mixed_precision=false")

    def held(self, shape, degrees):
        return first_chunk(shape, degrees.dp_shard)

    def buffer_bytes(self, spec):
        return gathered_bytes(spec)

    def gathers(self, degrees: Degrees) -> int:
        """All-gathers of the parameters per step: in forward and again in backward per pass; a pipeline's stage
        keeps them gathered through its micro-batches (as torchtitan runs FSDP under a pipeline)."""
        return 1 if degrees.pp > 1 else 2 * degrees.passes

    def traffic(self, spec, elements, degrees):
        n = degrees.dp_shard
        sent = self.gathers(degrees) * ring_gather(elements * gathered_bytes_per_element(spec), n) + ring_gather(
            elements * FP32, n)
        return sent, "parameter all-gather in forward and backward per micro-step, gradient reduce-scatter once per step"

    def calls(self, spec, elements, degrees):
        """One all-gather per block and the root per gather, one reduce-scatter of each once per step."""
        return "all-gather", (self.gathers(degrees) + 1) * (len(rank_blocks(spec, 0)) + 1)

    def overlap(self, spec, elements, degrees):
        """Each block's all-gather is prefetched while the block before it computes, and its reduce-scatter runs
        while the next computes backward, through the whole step: all but the root's (embeddings, gathered first
        and reduced last). Under a pipeline the stage reduces after its last micro-batch, exposed."""
        if degrees.pp > 1:
            return NO_OVERLAP
        return Overlap(self.traffic(spec, elements, degrees)[0] * (1 - root_share(spec)), 1.0)


class HSDPMethod(FSDPMethod):
    name = "hsdp"

    def split(self, dp, train):
        shard = train.data_parallel_shard_size
        return {"dp_replicate": dp // shard, "dp_shard": shard, "fixed_by": ("train.data_parallel_shard_size", shard)}

    def traffic(self, spec, elements, degrees):
        within, _ = super().traffic(spec, elements, degrees)
        across = ring_all_reduce(elements * FP32 / degrees.dp_shard, degrees.dp_replicate)
        return within + across, ("parameter all-gather within the shard group in forward and backward per micro-step; "
                                 "gradient reduce-scatter within it and all-reduce of each shard across the groups "
                                 "once per step")

    def calls(self, spec, elements, degrees):
        """FSDP's within the shard group, and an all-reduce per block and the root across the groups."""
        return "all-gather", (self.gathers(degrees) + 2) * (len(rank_blocks(spec, 0)) + 1)


class ZeRO2Method(FSDPMethod):
    name = "zero2"

    def buffer_bytes(self, spec):
        """Every block's gathered parameters, held from its forward to its backward."""
        return local_elements(spec) * gathered_bytes_per_element(spec)

    def traffic(self, spec, elements, degrees):
        n, passes = degrees.dp_shard, 1 if degrees.pp > 1 else degrees.passes
        sent = passes * (ring_gather(elements * gathered_bytes_per_element(spec), n) + ring_gather(elements * FP32, n))
        return sent, "parameter all-gather in forward and gradient reduce-scatter, per micro-step"

    def calls(self, spec, elements, degrees):
        """An all-gather and a reduce-scatter per block and the root, per micro-step."""
        return "all-gather", 2 * (1 if degrees.pp > 1 else degrees.passes) * (len(rank_blocks(spec, 0)) + 1)


class NoMethod(Method):
    """No data parallelism: one replica, split over every process (tp, pp and their products)."""

    name = NONE
    data_parallel = False

    def traffic(self, spec, elements, degrees):
        return 0.0, ""

    def calls(self, spec, elements, degrees):
        return "all-reduce", 0.0

    def buffer_bytes(self, spec):
        return 0

    def overlap(self, spec, elements, degrees):
        return NO_OVERLAP


METHODS: dict[str, Method] = {m.name: m for m in (
    SingleMethod(), DataParallelMethod(), DDPMethod(), HorovodMethod(), FSDPMethod(), ApexDDPMethod(), ZeRO1Method(),
    ZeRO2Method(), HSDPMethod(), NoMethod())}


# -- strategies: a method and degrees -----------------------------------------------------------------------------

@dataclass(frozen=True)
class Named:
    """What a named strategy says of itself beyond its split: one line for `gpt2dist strategies`, and the papers'
    names for it."""

    summary: str
    papers: dict[str, str]


NAMED_WORDS = {
    "single": Named("one process on one device: the reference every strategy must match",
                    {BAI: "Single GPU", PATWARDHAN: "single GPU"}),
    "dp": Named("torch.nn.DataParallel: one process scatters each batch over --nproc GPUs",
                {BAI: "Single Parameter Server"}),
    "ddp": Named("DistributedDataParallel: one process per device, bucketed all-reduce overlapped with backward",
                 {BAI: "Distributed Parameter Server", PATWARDHAN: "DDP"}),
    "horovod": Named("Horovod's DistributedOptimizer: ring all-reduce, launched by horovodrun", {BAI: "Horovod"}),
    "fsdp": Named("FSDP2 (fully_shard): parameters, gradients and optimizer state sharded over ranks",
                  {PATWARDHAN: "FSDP"}),
    "tp": Named("tensor parallelism (DTensor): every layer split over all --nproc ranks, one replica",
                {PATWARDHAN: "tensor parallelism"}),
    "pp": Named("pipeline parallelism (torch.distributed.pipelining): consecutive blocks per stage, one replica",
                {PATWARDHAN: "pipeline parallelism"}),
    "fsdp-tp": Named("FSDP over tensor-parallel groups of train.tensor_parallel_size ranks (2-D mesh)", {}),
    "apex-ddp": Named("apex.parallel.DistributedDataParallel (CUDA): Bai 2022's DDP + Apex wrapper",
                      {BAI: "Distributed Parameter Server + Apex"}),
    "zero1": Named("ZeRO-1: DDP's all-reduce, AdamW's state partitioned over ranks (ZeroRedundancyOptimizer)", {}),
    "zero2": Named("ZeRO-2 on FSDP2: parameters gathered once per forward, gradients and optimizer state sharded",
                   {}),
    "hsdp": Named("HSDP: FSDP2 sharding in groups of train.data_parallel_shard_size ranks, replicated across them",
                  {}),
}
METHOD_WORDS = {"ddp": "replicas with all-reduced gradients (DDP)", "fsdp": "FSDP2 over replicas",
                "hsdp": "HSDP over replicas", "zero2": "ZeRO-2 over replicas", NONE: "one replica"}


@dataclass(frozen=True)
class Description:
    """A strategy: its split (the name parsed) and its data-parallel method, composed."""

    split: Split
    method: Method

    @property
    def name(self) -> str:
        return self.split.name

    @property
    def summary(self) -> str:
        """One line for `gpt2dist strategies` and `train --help`."""
        if self.split.named:
            return NAMED_WORDS[self.name].summary
        parts = [f"{kind} {degree}" for kind, degree in (("tensor parallel", self.split.tp),
                                                         ("pipeline parallel", self.split.pp)) if degree != 1]
        each = "" if self.method.name == NONE else ", each"
        return f"{METHOD_WORDS[self.method.name]}{each} split {' x '.join(parts)}"

    @property
    def papers(self) -> dict[str, str]:
        """Paper -> what it calls this strategy."""
        return NAMED_WORDS[self.name].papers if self.split.named else {}

    @property
    def launcher(self) -> str:
        return self.method.launcher

    @property
    def one_process(self) -> bool:
        return self.launcher == "python"

    @property
    def data_parallel(self) -> bool:
        """Whole-model copies (replicated or sharded), each rank on its share of the batch."""
        return self.method.data_parallel and not self.split.splits_model

    @property
    def splits_model(self) -> bool:
        """The model itself is divided over processes (each group of them: one replica)."""
        return self.split.splits_model

    @property
    def shards_state(self) -> bool:
        return self.method.shards_state

    @property
    def idle_by_design(self) -> bool:
        """Ranks wait for each other by design (a pipeline's bubble)."""
        return self.split.pp != 1

    @property
    def cuda_only(self) -> bool:
        return self.method.cuda_only

    @property
    def accepts_apex(self) -> bool:
        """Apex amp can patch its model and optimizer: not a split model's."""
        return self.method.accepts_apex and not self.splits_model

    @property
    def extras(self) -> tuple[str, ...]:
        return self.method.extras

    @property
    def options(self) -> dict[str, str]:
        """train.* switches of this strategy alone -> when they apply (the method's, on an unsplit model)."""
        if self.name == "single":  # train.cuda_graphs needs compile_whole_model (the schema's check): single's too
            return {"compile_whole_model": "(the one process that holds the whole model, unwrapped)"}
        return {} if self.splits_model else self.method.options

    def degrees(self, nproc: int, train: TrainConfig) -> Degrees:
        """How this strategy divides nproc devices and the global batch (config.degrees checks them)."""
        tp, pp = self.split.degrees(nproc, train.tensor_parallel_size)
        dp = max(1, nproc // (tp * pp))
        extra = {}
        if self.name == "fsdp-tp":
            extra["fixed_by"] = ("train.tensor_parallel_size", tp)
        virtual = train.pipeline_virtual_stages if pp > 1 and train.pipeline_schedule in INTERLEAVED_SCHEDULES else 1
        return Degrees(self.name, nproc, train.global_batch_size, train.micro_batch_size,
                       **{**self.method.split(dp, train), **extra}, tp=tp, pp=pp, pp_virtual=virtual,
                       composed=not self.split.named, method=self.method.name)

    def check(self, spec: RunSpec, visible_gpus: int) -> None:
        """Refuse what this strategy cannot run with the precision and device, naming the key and what is allowed
        (Degrees.validate refuses what does not divide)."""
        self.method.check(spec, visible_gpus)
        degrees = degrees_of(spec)
        if degrees.pp > 1 and spec.precision == "fp16":
            raise UsageError(f"strategy '{self.name}' runs backward inside the pipeline schedule, where fp16's loss "
                             f"scaler cannot wrap it; use {self.name} with bf16")
        if degrees.tp > 1 and spec.precision == "fp16" and spec.device == "cuda":
            # seen on an H100 (torch 2.11): aten._amp_foreach_non_finite_check_and_unscale_ got mixed Tensor and DTensor
            raise UsageError(f"strategy '{self.name}' with fp16 on CUDA: the loss scaler checks all gradients in "
                             "one fused kernel, which refuses tensor parallelism's mix of DTensor and plain gradients; "
                             f"use {self.name} with bf16")

    def held_shapes(self, spec: RunSpec) -> list[tuple[int, ...]]:
        """The parameter tensors rank 0 holds, by local shape (rank 0 holds the largest share): its pipeline stage's,
        tensor-parallel slices of them, then the method's share (FSDP cuts each local tensor along dim 0)."""
        degrees = degrees_of(spec)
        return [self.method.held(shape, degrees) for shape in local_parameters(spec).values()]

    def optimizer_shapes(self, spec: RunSpec, rank: int = 0) -> list[tuple[int, ...]]:
        """The parameter tensors whose AdamW state `rank` holds (where ranks differ, rank 0 holds the largest
        share, but under zero1's partition)."""
        return self.method.optimizer_shapes(spec, self.held_shapes(spec), rank)

    def busiest_rank(self, spec: RunSpec) -> int:
        return self.method.busiest_rank(spec)

    def buffer_bytes(self, spec: RunSpec) -> int:
        return self.method.buffer_bytes(spec)

    def traffic(self, spec: RunSpec) -> Traffic:
        """Rank 0's bytes per step on each of its groups: the method's collectives on its local parameters over the
        data-parallel group, tensor parallelism's activation all-reduces, the pipeline's boundary sends."""
        degrees, parts = degrees_of(spec), []
        if degrees.dp > 1:
            elements = local_elements(spec)
            sent, what = self.method.traffic(spec, elements, degrees)
            if sent or what:
                parts.append(Collective("dp", degrees.dp, sent, what, *self.method.calls(spec, elements, degrees)))
        if degrees.tp > 1:
            blocks = len(rank_blocks(spec, 0))
            rows = degrees.global_batch_size // degrees.dp  # the rows this rank's replica computes per step
            # two in forward, two in backward, and forward's two again where backward recomputes each block
            per_block = 4 + 2 * (spec.train.activation_checkpointing == "block")
            parts.append(Collective("tp", degrees.tp,
                                    per_block * blocks * ring_all_reduce(activation_bytes(spec, rows), degrees.tp),
                                    "activation all-reduce after each block's two row-parallel projections (again "
                                    "where backward recomputes the block), and of their input gradients in backward",
                                    "all-reduce", per_block * blocks * degrees.passes))
        if degrees.pp > 1:
            parts.append(Collective("pp", degrees.pp, pipeline_bytes(spec, degrees),
                                    "activations forward and their gradients backward at each stage boundary per "
                                    "micro-batch, tied embedding gradients summed between the first and last stage",
                                    "send", 2 * degrees.pp_virtual * degrees.pipeline_micro_batches + 1))
        if not parts:
            return Traffic(0, "none")
        return Traffic(round(sum(part.bytes_per_step for part in parts)), "; ".join(part.what for part in parts),
                       tuple(parts))

    def overlap(self, spec: RunSpec) -> Overlap:
        """The data-parallel part the method sends while the step computes; tensor parallelism's all-reduces sit
        between a block's matmuls and a pipeline's waits are its bubble (results.prediction): neither hides."""
        degrees = degrees_of(spec)
        return self.method.overlap(spec, local_elements(spec), degrees) if degrees.dp > 1 else NO_OVERLAP


def pipeline_bytes(spec: RunSpec, degrees: Degrees) -> float:
    """What the busiest pipeline rank sends per step: each rank sends at each of its stages' boundaries, forward
    out of all but the last stage, backward out of all but the first; the first and last also sum the tied
    embedding's gradients (their local shard of it under a sharding method)."""
    m, micro_batches, virtual = spec.model, degrees.pipeline_micro_batches, degrees.pp_virtual
    per_micro = activation_bytes(spec, degrees.micro_batch_size)  # one micro-batch's activations at a boundary
    tied = ring_all_reduce(m.vocab_size * m.n_embd * FP32 / degrees.dp_shard, 2)
    ends = (2 * virtual - 1) * micro_batches * per_micro + tied
    middle = 2 * virtual * micro_batches * per_micro if degrees.pp > 2 else 0
    return max(ends, middle)


@functools.cache
def describe(name: str) -> Description:
    """The strategy a name says: one of the twelve, or a method with degrees (config.split)."""
    split = parse_split(name)
    return Description(split, METHODS[split.method])


# in config.split's NAMED order, the order of every table and figure
STRATEGIES: dict[str, Description] = {name: describe(name) for name in NAMED}
REFERENCE = "single"  # the strategy every other one must follow


def degrees_of(spec: RunSpec) -> Degrees:
    """The run's degrees (checked by check_run before a run starts)."""
    return describe(spec.strategy).degrees(spec.nproc, spec.train)


def called(paper: str, their_name: str) -> str:
    """Our strategy for what `paper` calls `their_name` (the papers' claims are stated in their words)."""
    return next(name for name, d in STRATEGIES.items() if d.papers.get(paper) == their_name)


def extras_needed(strategy: str, precision: str) -> list[Extra]:
    return [EXTRAS[key] for key in (*describe(strategy).extras, *PRECISION_EXTRAS.get(precision, ()))]


def traffic(spec: RunSpec) -> Traffic:
    if spec.nproc == 1:
        return Traffic(0, "none: one device")
    return describe(spec.strategy).traffic(spec)


def overlap(spec: RunSpec) -> Overlap:
    return NO_OVERLAP if spec.nproc == 1 else describe(spec.strategy).overlap(spec)


def splits_of(nproc: int, per_node: int, model: ModelConfig, train: TrainConfig) -> list[str]:
    """Every strategy a planner can weigh on `nproc` devices, `per_node` on each node: each named strategy but
    single (those that cannot run here among them, for check_run to say why), and every factorisation
    nproc = dp x tp x pp (tp inside a node and dividing the heads, a block per stage at least) with each
    data-parallel method that composes, or none where dp is 1. A split that is a named strategy's point is named so
    (tp, pp, fsdp-tp)."""
    names = [name for name in STRATEGIES if name != REFERENCE]
    for tp in range(1, min(model.n_head, per_node) + 1):  # a degree divides the heads: counted by them, not the GPUs
        if per_node % tp or model.n_head % tp or nproc % tp:
            continue
        for pp in range(1, min(model.n_layer, nproc // tp) + 1):
            if (tp, pp) == (1, 1) or nproc % (tp * pp):
                continue
            methods = [NONE] if tp * pp == nproc else ["ddp", "fsdp", "hsdp", "zero2"]
            names += [named_point(method, tp, pp, nproc, train) for method in methods]
    return list(dict.fromkeys(names))


def named_point(method: str, tp: int, pp: int, nproc: int, train: TrainConfig) -> str:
    """The name a split goes by: a named strategy's where one has these degrees at `nproc`, else its own."""
    for name, d in STRATEGIES.items():
        if d.splits_model and d.method.name == method and d.split.degrees(nproc, train.tensor_parallel_size) == (tp, pp):
            return name
    return composed_name(method, tp, pp)


def spans_nodes(spec: RunSpec, group: str, nodes: int | None = None) -> bool:
    """Whether rank 0's group of a kind ("dp", "tp", "pp") has ranks on more than one of `nodes` nodes (default:
    the spec's; nodes hold consecutive ranks, nproc / nodes each)."""
    return degrees_of(spec).farthest(GROUP_DIMS[group]) >= spec.nproc // (nodes or spec.nodes)  # rank 0's is on node 0


def link_streams(spec: RunSpec, group: str, nodes: int | None = None) -> int:
    """How many groups of a kind send across one node's link at once: every rank of a node sends its bytes, and a
    group with m ranks on a node (its ring crossing the node's link once each way) shares the link with the node's
    other groups, per node / m of them (ddp over every rank: one; ddp-tp8 on nodes of 8: eight data-parallel
    pairs). 1 for a group inside a node."""
    if not spans_nodes(spec, group, nodes):
        return 1
    per_node = spec.nproc // (nodes or spec.nodes)
    return per_node // degrees_of(spec).members_below(GROUP_DIMS[group], per_node)


def crossing_bytes(spec: RunSpec, nodes: int | None = None) -> float:
    """The bytes per step a node's link carries each way (`nodes`: the spec's where not given, as for emulated
    ones): each group that spans nodes, its busiest rank's bytes times the groups that share the link."""
    return sum(part.bytes_per_step * link_streams(spec, part.group, nodes) for part in traffic(spec).parts
               if spans_nodes(spec, part.group, nodes))


def check_tensor_parallel_inside_nodes(spec: RunSpec, nodes: int) -> None:
    """A tensor-parallel group is consecutive ranks: refuse one that `nodes` nodes would split, naming the fix."""
    tp, per_node = degrees_of(spec).tp, spec.nproc // nodes
    if tp > 1 and per_node % tp:
        raise UsageError(f"strategy '{spec.strategy}' splits every layer over {tp} consecutive ranks, and with "
                         f"{per_node} processes on each of {nodes} nodes a tensor-parallel group would span nodes "
                         "(four all-reduces per block and micro-batch on the link between them); use a "
                         f"tensor-parallel degree that divides {per_node}, or {tp} processes or more per node")


def check_run(spec: RunSpec, visible_gpus: int) -> None:
    """Refuse a combination that cannot run, naming the key and what is allowed."""
    description = describe(spec.strategy)
    description.check(spec, visible_gpus)
    for option, when in {option: when for d in STRATEGIES.values() for option, when in d.options.items()}.items():
        if option not in description.options and getattr(spec.train, option):
            owners = [name for name, d in STRATEGIES.items() if option in d.options]
            said = owners[0] if len(owners) == 1 else f"{', '.join(owners[:-1])} or {owners[-1]}"
            raise UsageError(f"train.{option} applies to --strategy {said} {when}, not {spec.strategy} with "
                             f"{spec.precision}; set train.{option}=false")
    if spec.train.cuda_graphs and spec.device != "cuda":
        raise UsageError("train.cuda_graphs replays the step as CUDA graphs, which need a CUDA GPU; on CPU set "
                         "train.cuda_graphs=false")
    if spec.precision in APEX_PRECISIONS:
        if not description.accepts_apex:
            raise UsageError(f"precision 'apex-*' cannot wrap {spec.strategy}'s sharded or split parameters or "
                             f"optimizer state; use {spec.strategy} with bf16 or fp16")
        if spec.device != "cuda":
            raise UsageError(f"precision '{spec.precision}' needs CUDA; on CPU use bf16 or fp16 (torch.amp)")
    check_placement(spec, visible_gpus)


def check_placement(spec: RunSpec, visible_gpus: int) -> None:
    """Refuse degrees that do not divide the model, the batch or the cluster (a tensor-parallel group inside a
    node): what any run of the split needs, whatever this engine's runtime can run of it (check_run refuses that
    too). The planner holds published runs of other frameworks to this alone."""
    description, degrees = describe(spec.strategy), degrees_of(spec)
    degrees.validate(spec.model, spec.train)
    if spec.nodes > 1:
        if description.one_process:
            raise UsageError(f"strategy '{spec.strategy}' runs in one process, which cannot spread over {spec.nodes} "
                             f"nodes; use one of {', '.join(n for n, d in STRATEGIES.items() if not d.one_process)}")
        if spec.nproc % spec.nodes:
            raise UsageError(f"--nproc {spec.nproc} does not divide over {spec.nodes} nodes; give each node as many "
                             f"processes (e.g. --nproc {spec.nodes * max(1, spec.nproc // spec.nodes)})")
        check_tensor_parallel_inside_nodes(spec, spec.nodes)
    per_node = spec.nproc // spec.nodes
    if spec.device == "cuda" and per_node > visible_gpus:
        where = f" on each of {spec.nodes} nodes" if spec.nodes > 1 else ""
        raise UsageError(f"--nproc {spec.nproc} needs {per_node} CUDA GPUs{where}, but this node sees {visible_gpus}")

