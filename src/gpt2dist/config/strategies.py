"""Every parallel strategy described once, without torch: how it is launched, its degrees for a process
count (config.degrees), the extras it needs, the combinations it refuses, the bytes it moves per step and how
many of them it sends while it computes, and what the papers call it. Config, planning, preflight, doctor, selftest, findings and the CLI ask this
registry; its runtime half, under training/strategies/, has the same `name` (here `<Name>Description`, there
`<Name>`).

Adding a strategy: its name in config.schema's StrategyName, one Description subclass here (listed in
STRATEGIES), one runtime class under training/strategies/ with the same `name`, and its equivalence, resume
and bad-input tests.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from typing import ClassVar

from gpt2dist.config.degrees import Degrees
from gpt2dist.config.schema import INTERLEAVED_SCHEDULES, STRATEGY_NAMES, ModelConfig, RunSpec, TrainConfig
from gpt2dist.config.sizes import (
    COLUMN_PARALLEL,
    ROW_PARALLEL,
    parameter_count,
    parameter_shapes,
    split_parameter_count,
    weight_decayed,
)
from gpt2dist.errors import UsageError

BAI, PATWARDHAN = "Bai 2022", "Patwardhan et al. 2024"
FP32, HALF = 4, 2  # bytes per element
APEX_PRECISIONS = ("apex-O1", "apex-O2")
# Horovod's fusion buffer (HOROVOD_FUSION_THRESHOLD): 0.28's horovod/common/operations.cc sets 128 MiB by default,
# though its tensor-fusion docs still say 64 MB
HOROVOD_FUSION_BYTES = 128 * 2**20


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
class Traffic:
    """Bytes the busiest rank sends per optimizer step, by an analytic model (not measured)."""

    bytes_per_step: int
    pattern: str


@dataclass(frozen=True)
class Overlap:
    """The part of a step's traffic a strategy sends while its GPUs compute, and how much of the step's computation
    can cover it (a share of it): on GPUs, communication beyond that cover is what the step waits for."""

    bytes_per_step: float
    under: float


NO_OVERLAP = Overlap(0.0, 0.0)
# Backward's share of a step's FLOPs: 4 of every 6 per parameter and token (forward 2)
BACKWARD_SHARE = 2 / 3


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
    """Every stage's blocks in the pipeline's order, `ranks` x `virtual` stages; stage s runs on rank s % ranks."""
    return stage_blocks(n_layer, ranks * virtual)


def gathered_bytes(spec: RunSpec) -> int:
    """FSDP's gathered parameters at the peak: the root's (embeddings and ln_f, kept after forward) and two blocks'
    (the one computing and the one prefetched), each rank's tensor-parallel slice of them."""
    block = sum(math.prod(shape) for name, shape in parameter_shapes(spec.model).items()
                if name.startswith("transformer.h.0."))
    return round((root_elements(spec.model) + 2 * block) * FP32 / degrees_of(spec).tp)


def gathered_bytes_per_element(spec: RunSpec) -> int:
    """Bytes per parameter element FSDP2 gathers: 16 bits under train.fsdp_mixed_precision, else fp32."""
    return HALF if spec.train.fsdp_mixed_precision else FP32


def compute_bytes(precision: str) -> int:
    """Bytes per activation element in the precision's compute dtype (16-bit under autocast and Apex amp)."""
    return HALF if precision in ("bf16", "fp16", *APEX_PRECISIONS) else FP32


def activation_bytes(spec: RunSpec) -> int:
    """One forward pass's hidden states [rows, context, width] in the precision's compute dtype."""
    m = spec.model
    return degrees_of(spec).rows_per_pass * m.n_positions * m.n_embd * compute_bytes(spec.precision)


class Description:
    """Defaults describe one process per device, each a whole replica of the model (plain data parallelism)."""

    name: ClassVar[str]
    summary: ClassVar[str]  # one line for `gpt2dist train --help`
    launcher: ClassVar[str] = "torchrun"  # "python": one process drives every device of the run
    data_parallel: ClassVar[bool] = True  # whole-model replicas, each on its share of the batch
    splits_model: ClassVar[bool] = False  # the model itself is divided over processes (each group: one replica)
    shards_state: ClassVar[bool] = False  # parameters, gradients and optimizer state are sharded over ranks
    idle_by_design: ClassVar[bool] = False  # ranks wait for each other by design (a pipeline's bubble)
    cuda_only: ClassVar[bool] = False
    accepts_apex: ClassVar[bool] = True  # Apex amp can patch its model and optimizer
    extras: ClassVar[tuple[str, ...]] = ()  # keys of EXTRAS
    options: ClassVar[dict[str, str]] = {}  # train.* switches of this strategy alone -> when they apply
    papers: ClassVar[dict[str, str]] = {}  # paper -> what it calls this strategy

    @property
    def one_process(self) -> bool:
        return self.launcher == "python"

    def degrees(self, nproc: int, train: TrainConfig) -> Degrees:
        """How this strategy divides nproc devices and the global batch (config.degrees checks them)."""
        return Degrees(self.name, nproc, train.global_batch_size, train.micro_batch_size, **self.split(nproc, train))

    def split(self, nproc: int, train: TrainConfig) -> dict:
        """The degrees that are not 1: a whole replica on every device."""
        return {"dp_replicate": nproc}

    def check(self, spec: RunSpec, visible_gpus: int) -> None:
        """Refuse what this strategy cannot run with the precision and device, naming the key and what is allowed
        (Degrees.validate refuses what does not divide)."""

    def held_shapes(self, spec: RunSpec) -> list[tuple[int, ...]]:
        """The parameter tensors rank 0 holds, by local shape (rank 0 holds the largest share): every one, whole."""
        return list(parameter_shapes(spec.model).values())

    def optimizer_shapes(self, spec: RunSpec, rank: int = 0) -> list[tuple[int, ...]]:
        """The parameter tensors whose AdamW state `rank` holds: those rank 0 holds (where ranks differ, rank 0
        holds the largest share)."""
        return self.held_shapes(spec)

    def busiest_rank(self, spec: RunSpec) -> int:
        """The rank holding the most model state: rank 0 unless the optimizer's partition says otherwise."""
        return 0

    def buffer_bytes(self, spec: RunSpec) -> int:
        """Device memory its communication takes beyond the model state (an estimate): none, since DDP's buckets
        are the gradients themselves (gradient_as_bucket_view)."""
        return 0

    def traffic(self, spec: RunSpec) -> Traffic:
        size = parameter_count(spec.model) * gradient_bytes(spec.precision)
        return Traffic(round(ring_all_reduce(size, spec.nproc)), "gradient all-reduce, once per step")

    def overlap(self, spec: RunSpec) -> Overlap:
        """The gradient all-reduce runs bucket by bucket as backward produces them (DDP's buckets, Horovod's and
        Apex's hooks) under the last micro-step's backward (the others skip it), all but the embeddings' bucket."""
        size = parameter_count(spec.model) * gradient_bytes(spec.precision) * (1 - root_share(spec))
        return Overlap(ring_all_reduce(size, spec.nproc), BACKWARD_SHARE / degrees_of(spec).grad_accum_steps)


class SingleDescription(Description):
    name = "single"
    summary = "one process on one device: the reference every strategy must match"
    launcher = "python"
    data_parallel = False
    papers = {BAI: "Single GPU", PATWARDHAN: "single GPU"}
    # train.cuda_graphs needs compile_whole_model (the schema's check), so it is single's alone too
    options = {"compile_whole_model": "(the one process that holds the whole model, unwrapped)"}

    def check(self, spec, visible_gpus):
        if spec.nproc != 1:
            raise UsageError(f"strategy 'single' runs one process; got --nproc {spec.nproc} (use ddp, fsdp or horovod)")


class DataParallelDescription(Description):
    name = "dp"
    summary = "torch.nn.DataParallel: one process scatters each batch over --nproc GPUs"
    launcher = "python"
    papers = {BAI: "Single Parameter Server"}

    def split(self, nproc, train):
        return {"dp_replicate": nproc, "devices_per_process": nproc}  # one process reads and scatters every share

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

    def traffic(self, spec):
        if spec.device != "cuda":
            return Traffic(0, "none: DataParallel without CUDA runs on one device")
        sent = 2 * (spec.nproc - 1) * parameter_count(spec.model) * FP32 * degrees_of(spec).grad_accum_steps
        return Traffic(round(sent), "parameters broadcast from and gradients reduced to GPU 0, every micro-step")

    def overlap(self, spec):
        """One process broadcasts before and reduces after each micro-step's computation."""
        return NO_OVERLAP


class DDPDescription(Description):
    name = "ddp"
    summary = "DistributedDataParallel: one process per device, bucketed all-reduce overlapped with backward"
    papers = {BAI: "Distributed Parameter Server", PATWARDHAN: "DDP"}


class ZeRO1Description(DDPDescription):
    name = "zero1"
    summary = "ZeRO-1: DDP's all-reduce, AdamW's state partitioned over ranks (ZeroRedundancyOptimizer)"
    accepts_apex = False
    papers = {}

    def optimizer_shapes(self, spec, rank=0):
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

    def traffic(self, spec):
        params, n = parameter_count(spec.model), spec.nproc
        sent = ring_all_reduce(params * gradient_bytes(spec.precision), n) + ring_gather(params * FP32, n)
        return Traffic(round(sent), "gradient all-reduce, then each rank's updated parameters broadcast, once per step")


class HorovodDescription(Description):
    name = "horovod"
    summary = "Horovod's DistributedOptimizer: ring all-reduce, launched by horovodrun"
    launcher = "horovodrun"
    extras = ("horovod.torch",)
    papers = {BAI: "Horovod"}

    def buffer_bytes(self, spec):
        return HOROVOD_FUSION_BYTES

    def overlap(self, spec):
        """Under Apex O2 the model's cast to fp16 replaces the gradients Horovod hooked, and every gradient is
        reduced after backward (training/strategies/horovod.py)."""
        return NO_OVERLAP if spec.precision == "apex-O2" else super().overlap(spec)


class ApexDDPDescription(Description):
    name = "apex-ddp"
    summary = "apex.parallel.DistributedDataParallel (CUDA): Bai 2022's DDP + Apex wrapper"
    cuda_only = True
    extras = ("apex.parallel",)
    papers = {BAI: "Distributed Parameter Server + Apex"}

    def check(self, spec, visible_gpus):
        if spec.device != "cuda":
            raise UsageError("strategy 'apex-ddp' (apex.parallel.DistributedDataParallel) needs CUDA GPUs; on CPU "
                             "use ddp")
        if spec.precision in ("fp16", "bf16"):
            raise UsageError(f"strategy 'apex-ddp' pairs with Apex amp (apex-O1, apex-O2) or fp32, not torch.amp's "
                             f"{spec.precision}; use ddp for {spec.precision}")


class FSDPDescription(Description):
    name = "fsdp"
    summary = "FSDP2 (fully_shard): parameters, gradients and optimizer state sharded over ranks"
    shards_state = True
    accepts_apex = False
    options = {"fsdp_mixed_precision": "with --precision bf16 or fp16"}
    papers = {PATWARDHAN: "FSDP"}

    def split(self, nproc, train):
        return {"dp_shard": nproc}

    def check(self, spec, visible_gpus):
        if spec.train.fsdp_mixed_precision and spec.precision not in ("bf16", "fp16"):
            raise UsageError(f"train.fsdp_mixed_precision applies to --strategy {spec.strategy} "
                             f"{self.options['fsdp_mixed_precision']}, not {spec.strategy} with {spec.precision}; set "
                             "train.fsdp_mixed_precision=false")

    def held_shapes(self, spec):
        return [first_chunk(shape, degrees_of(spec).dp_shard) for shape in super().held_shapes(spec)]

    def buffer_bytes(self, spec):
        return gathered_bytes(spec)

    def traffic(self, spec):
        degrees = degrees_of(spec)
        params, n, accum = parameter_count(spec.model), degrees.dp_shard, degrees.grad_accum_steps
        sent = 2 * accum * ring_gather(params * gathered_bytes_per_element(spec), n) + ring_gather(params * FP32, n)
        return Traffic(round(sent), "parameter all-gather in forward and backward per micro-step, gradient "
                                    "reduce-scatter once per step")

    def overlap(self, spec):
        """Each block's all-gather is prefetched while the block before it computes, and its reduce-scatter runs
        while the next computes backward, through the whole step: all but the root's (embeddings, gathered first
        and reduced last)."""
        return Overlap(self.traffic(spec).bytes_per_step * (1 - root_share(spec)), 1.0)


class HSDPDescription(FSDPDescription):
    name = "hsdp"
    summary = "HSDP: FSDP2 sharding in groups of train.data_parallel_shard_size ranks, replicated across them"
    papers = {}

    def split(self, nproc, train):
        shard = train.data_parallel_shard_size
        return {"dp_replicate": nproc // shard, "dp_shard": shard,
                "fixed_by": ("train.data_parallel_shard_size", shard)}

    def traffic(self, spec):
        degrees = degrees_of(spec)
        across = ring_all_reduce(parameter_count(spec.model) * FP32 / degrees.dp_shard, degrees.dp_replicate)
        return Traffic(round(super().traffic(spec).bytes_per_step + across),
                       "parameter all-gather within the shard group in forward and backward per micro-step; "
                       "gradient reduce-scatter within it and all-reduce of each shard across the groups once per "
                       "step")


class ZeRO2Description(FSDPDescription):
    name = "zero2"
    summary = "ZeRO-2 on FSDP2: parameters gathered once per forward, gradients and optimizer state sharded"
    papers = {}

    def buffer_bytes(self, spec):
        """Every block's gathered parameters, held from its forward to its backward."""
        return parameter_count(spec.model) * gathered_bytes_per_element(spec)

    def traffic(self, spec):
        degrees = degrees_of(spec)
        params, n, accum = parameter_count(spec.model), degrees.dp_shard, degrees.grad_accum_steps
        sent = accum * (ring_gather(params * gathered_bytes_per_element(spec), n) + ring_gather(params * FP32, n))
        return Traffic(round(sent), "parameter all-gather in forward and gradient reduce-scatter, per micro-step")


class _SplitsLayersDescription(Description):
    """Tensor parallelism's shared rules: attention heads and MLP columns divide over the layer's ranks."""

    data_parallel = False
    splits_model = True
    accepts_apex = False

    def check(self, spec, visible_gpus):
        if spec.precision == "fp16" and spec.device == "cuda":
            # seen on an H100 (torch 2.11): aten._amp_foreach_non_finite_check_and_unscale_ got mixed Tensor and DTensor
            raise UsageError(f"strategy '{spec.strategy}' with fp16 on CUDA: the loss scaler checks all gradients in "
                             "one fused kernel, which refuses tensor parallelism's mix of DTensor and plain gradients; "
                             f"use {spec.strategy} with bf16")

    def held_shapes(self, spec):
        """Column-parallel tensors split their rows, row-parallel ones their columns (config.sizes); the rest
        stays whole. Sharded state: FSDP2 then cuts each local tensor along dim 0 over the replicas."""
        degrees, shapes = degrees_of(spec), []
        for name, (rows, *rest) in parameter_shapes(spec.model).items():
            if name.endswith(COLUMN_PARALLEL):
                rows //= degrees.tp
            elif name.endswith(ROW_PARALLEL):
                rest = [rest[0] // degrees.tp]
            shapes.append((rows, *rest))
        return [first_chunk(shape, degrees.dp_shard) for shape in shapes]

    def buffer_bytes(self, spec):
        return gathered_bytes(spec) if self.shards_state else 0

    def overlap(self, spec):
        """The activations' all-reduces sit between a block's matmuls, on the path of the step (FSDP's part of
        fsdp-tp could hide, and is not counted as hidden: an upper bound on its step)."""
        return NO_OVERLAP

    def activation_traffic(self, spec: RunSpec) -> float:
        """All-reduces of activations after each block's two row-parallel projections, forward and backward."""
        degrees = degrees_of(spec)
        return 4 * spec.model.n_layer * degrees.grad_accum_steps * ring_all_reduce(activation_bytes(spec), degrees.tp)


class TensorParallelDescription(_SplitsLayersDescription):
    name = "tp"
    summary = "tensor parallelism (DTensor): every layer split over all --nproc ranks, one replica"
    papers = {PATWARDHAN: "tensor parallelism"}

    def split(self, nproc, train):
        return {"tp": nproc}

    def traffic(self, spec):
        return Traffic(round(self.activation_traffic(spec)), "activation all-reduce after each block's two "
                                                             "row-parallel projections, and of their input gradients "
                                                             "in backward")


class FSDPTensorParallelDescription(_SplitsLayersDescription):
    name = "fsdp-tp"
    summary = "FSDP over tensor-parallel groups of train.tensor_parallel_size ranks (2-D mesh)"
    shards_state = True

    def split(self, nproc, train):
        tp = train.tensor_parallel_size
        return {"dp_shard": nproc // tp, "tp": tp, "fixed_by": ("train.tensor_parallel_size", tp)}

    def traffic(self, spec):
        degrees = degrees_of(spec)
        m, tp, replicas, accum = spec.model, degrees.tp, degrees.dp_shard, degrees.grad_accum_steps
        local = parameter_count(m) - split_parameter_count(m) + split_parameter_count(m) / tp
        sent = self.activation_traffic(spec) + 2 * accum * ring_gather(local * FP32, replicas) + ring_gather(
            local * FP32, replicas)
        return Traffic(round(sent), "tensor-parallel activation all-reduces, and FSDP's all-gathers and "
                                    "reduce-scatter of each rank's slice over the replicas")


class PipelineParallelDescription(Description):
    name = "pp"
    summary = "pipeline parallelism (torch.distributed.pipelining): consecutive blocks per stage, one replica"
    data_parallel = False
    splits_model = True
    idle_by_design = True
    accepts_apex = False
    papers = {PATWARDHAN: "pipeline parallelism"}

    def split(self, nproc, train):
        virtual = train.pipeline_virtual_stages if train.pipeline_schedule in INTERLEAVED_SCHEDULES else 1
        return {"pp": nproc, "pp_virtual": virtual, "whole_batch_per_pass": True}

    def check(self, spec, visible_gpus):
        if spec.precision == "fp16":
            raise UsageError("strategy 'pp' runs backward inside the pipeline schedule, where fp16's loss scaler "
                             "cannot wrap it; use pp with bf16")

    def held_shapes(self, spec):
        """The first rank's: the embeddings and the blocks of its stages (the last rank's ln_f and head copy are
        smaller than wpe and the first stages' extra blocks)."""
        first = rank_blocks(spec, 0)
        return [shape for name, shape in parameter_shapes(spec.model).items()
                if name.startswith(("transformer.wte.", "transformer.wpe."))
                or any(name.startswith(f"transformer.h.{block}.") for block in first)]

    def traffic(self, spec):
        degrees = degrees_of(spec)
        m, n, micro_batches, virtual = spec.model, degrees.pp, degrees.pipeline_micro_batches, degrees.pp_virtual
        per_micro = activation_bytes(spec) // micro_batches  # one micro-batch's activations at a stage boundary
        tied = ring_all_reduce(m.vocab_size * m.n_embd * FP32, 2)  # embedding and head copies' gradients
        # each rank sends at each of its stages' boundaries: forward out of all but the last stage, backward out
        # of all but the first
        ends = (2 * virtual - 1) * micro_batches * per_micro + tied
        middle = 2 * virtual * micro_batches * per_micro if n > 2 else 0
        return Traffic(round(max(ends, middle)), "activations forward and their gradients backward at each stage "
                                                 "boundary per micro-batch, tied embedding gradients summed "
                                                 "between the first and last stage")

    def overlap(self, spec):
        """A stage sends while the next micro-batch computes, but the bubble (results.prediction) already counts
        what a stage waits for: nothing more is hidden."""
        return NO_OVERLAP


def rank_blocks(spec: RunSpec, rank: int) -> list[int]:
    """The blocks a pipeline's rank holds: those of stages rank, rank + pp, ..."""
    degrees = degrees_of(spec)
    stages = pipeline_stage_blocks(spec.model.n_layer, degrees.pp, degrees.pp_virtual)
    return [block for blocks in stages[rank::degrees.pp] for block in blocks]


# in config.schema's STRATEGY_NAMES order, the order of every table and figure
STRATEGIES: dict[str, Description] = {d.name: d for d in (
    SingleDescription(), DataParallelDescription(), DDPDescription(), HorovodDescription(), FSDPDescription(),
    TensorParallelDescription(), PipelineParallelDescription(), FSDPTensorParallelDescription(), ApexDDPDescription(),
    ZeRO1Description(), ZeRO2Description(), HSDPDescription(),
)}
REFERENCE = "single"  # the strategy every other one must follow


def describe(name: str) -> Description:
    try:
        return STRATEGIES[name]
    except KeyError:
        raise UsageError(f"unknown --strategy {name!r} (allowed: {', '.join(STRATEGY_NAMES)})") from None


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
    degrees_of(spec).validate(spec.model, spec.train)
    if spec.nodes > 1:
        if description.one_process:
            raise UsageError(f"strategy '{spec.strategy}' runs in one process, which cannot spread over {spec.nodes} "
                             f"nodes; use one of {', '.join(n for n, d in STRATEGIES.items() if not d.one_process)}")
        if spec.nproc % spec.nodes:
            raise UsageError(f"--nproc {spec.nproc} does not divide over {spec.nodes} nodes; give each node as many "
                             f"processes (e.g. --nproc {spec.nodes * max(1, spec.nproc // spec.nodes)})")
    per_node = spec.nproc // spec.nodes
    if spec.device == "cuda" and per_node > visible_gpus:
        where = f" on each of {spec.nodes} nodes" if spec.nodes > 1 else ""
        raise UsageError(f"--nproc {spec.nproc} needs {per_node} CUDA GPUs{where}, but this node sees {visible_gpus}")
