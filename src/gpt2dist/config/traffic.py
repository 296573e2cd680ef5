"""The bytes a run's busiest rank sends per step, by an analytic model (not measured), on each of its process groups,
and which of them cross a node's link: the data-parallel method's collectives on the rank's local parameters
(config.methods, from its settings), tensor parallelism's activation all-reduces, the pipeline's boundary sends.
The runs record it, collect sets it beside what emulated links measured, and the step models price it."""

from __future__ import annotations

from dataclasses import dataclass

from gpt2dist.config.degrees import Degrees
from gpt2dist.config.geometry import activation_bytes, part_of, rank_blocks
from gpt2dist.config.methods import NO_OVERLAP, Overlap
from gpt2dist.config.schema import RunSpec
from gpt2dist.config.strategies import degrees_of, describe
from gpt2dist.config.units import FP32, ring_all_reduce

# The mesh dimensions a collective group spans; the data-parallel group's is the part that can hide under compute
DATA_PARALLEL_GROUP, TENSOR_PARALLEL_GROUP, PIPELINE_GROUP = "dp", "tp", "pp"
GROUP_DIMS = {DATA_PARALLEL_GROUP: ("dp_replicate", "dp_shard"), TENSOR_PARALLEL_GROUP: ("tp",), PIPELINE_GROUP: ("pp",)}


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


def traffic(spec: RunSpec) -> Traffic:
    """Rank 0's bytes per step on each of its groups: the method's collectives on its local parameters over the
    data-parallel group, tensor parallelism's activation all-reduces, the pipeline's boundary sends."""
    if spec.nproc == 1:
        return Traffic(0, "none: one device")
    degrees, parts = degrees_of(spec), []
    if degrees.dp > 1:
        sent, what, kind, calls = describe(spec.strategy).method.collectives(spec, degrees, part_of(spec))
        if sent or what:
            parts.append(Collective(DATA_PARALLEL_GROUP, degrees.dp, sent, what, kind, calls))
    if degrees.tp > 1:
        blocks = len(rank_blocks(spec, 0))
        rows = degrees.global_batch_size // degrees.dp  # the rows this rank's replica computes per step
        # two in forward, two in backward, and forward's two again where backward recomputes each block
        per_block = 4 + 2 * (spec.train.activation_checkpointing == "block")
        parts.append(Collective(TENSOR_PARALLEL_GROUP, degrees.tp, per_block * blocks * ring_all_reduce(activation_bytes(spec, rows),
                                                                                     degrees.tp),
                                "activation all-reduce after each block's two row-parallel projections (again where "
                                "backward recomputes the block), and of their input gradients in backward",
                                "all-reduce", per_block * blocks * degrees.passes))
    if degrees.pp > 1:
        parts.append(Collective(PIPELINE_GROUP, degrees.pp, pipeline_bytes(spec, degrees),
                                "activations forward and their gradients backward at each stage boundary per "
                                "micro-batch, tied embedding gradients summed between the first and last stage",
                                "send", 2 * degrees.pp_virtual * degrees.pipeline_micro_batches + 1))
    if not parts:
        return Traffic(0, "none")
    return Traffic(round(sum(part.bytes_per_step for part in parts)), "; ".join(part.what for part in parts),
                   tuple(parts))


def overlap(spec: RunSpec) -> Overlap:
    """The data-parallel part the method sends while the step computes; tensor parallelism's all-reduces sit
    between a block's matmuls and a pipeline's waits are its bubble (forecast.prediction): neither hides."""
    degrees = degrees_of(spec)
    if spec.nproc == 1 or degrees.dp == 1:
        return NO_OVERLAP
    return describe(spec.strategy).method.overlap(spec, degrees, part_of(spec))


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
