"""Which parameters a rank holds under a split, without torch: its pipeline stages' blocks (the embeddings on the
first stage, ln_f and the head's copy of the tied embedding on the last), tensor-parallel slices of them, and what
the data-parallel method gathers. The memory and traffic models and the pipeline's runtime split (training/
strategies/pipeline_parallel.py) all cut the model this way."""

from __future__ import annotations

import functools
import math

from gpt2dist.config.methods import Part
from gpt2dist.config.schema import ModelConfig, RunSpec
from gpt2dist.config.sizes import COLUMN_PARALLEL, ROW_PARALLEL, parameter_count, parameter_shapes
from gpt2dist.config.strategies import degrees_of
from gpt2dist.config.units import FP32, HALF, compute_bytes

HEAD = "lm_head.weight"  # the last pipeline stage's copy of the tied token embedding


def root_elements(m: ModelConfig) -> int:
    """Parameters outside the blocks: the embeddings and the final layer norm (FSDP's root module holds them)."""
    return sum(math.prod(shape) for name, shape in parameter_shapes(m).items() if not name.startswith("transformer.h."))


def root_share(spec: RunSpec) -> float:
    """The root's share of the parameters: their gradient is complete only when backward reaches the input (the
    head shares wte), and FSDP gathers them first and reduces them last, so their traffic never runs under
    compute."""
    return root_elements(spec.model) / parameter_count(spec.model)


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
    return _rank_blocks(spec.model.n_layer, degrees.pp, degrees.pp_virtual, stage_rank)


def _rank_blocks(n_layer: int, pp: int, virtual: int, stage_rank: int) -> list[int]:
    return [block for blocks in pipeline_stage_blocks(n_layer, pp, virtual)[stage_rank::pp] for block in blocks]


def stage_parameters(spec: RunSpec, rank: int = 0) -> dict[str, tuple[int, ...]]:
    """The parameter tensors `rank`'s pipeline stages hold, whole, by name: every one without a pipeline; else the
    blocks of its stages, the embeddings on the first and ln_f with the head's copy of the tied embedding on the
    last (training/strategies/pipeline_parallel.py's RankPart)."""
    degrees = degrees_of(spec)
    return dict(_stage_parameters(spec.model, degrees.pp, degrees.pp_virtual, degrees.coordinates(rank)["pp"]))


@functools.lru_cache(maxsize=1024)
def _stage_parameters(model: ModelConfig, pp: int, virtual: int, stage: int) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """stage_parameters' of a pipeline coordinate, once per model and pipeline: a planner asks for thousands."""
    shapes = parameter_shapes(model)
    if pp == 1:
        return tuple(shapes.items())
    first, last = stage == 0, stage == pp - 1
    blocks = tuple(f"transformer.h.{block}." for block in _rank_blocks(model.n_layer, pp, virtual, stage))
    held = {name: shape for name, shape in shapes.items()
            if name.startswith(blocks) or (first and name.startswith(("transformer.wte.", "transformer.wpe.")))
            or (last and name.startswith("transformer.ln_f."))}
    if last and not first:
        held[HEAD] = shapes["transformer.wte.weight"]
    return tuple(held.items())


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
    degrees = degrees_of(spec)
    return dict(_local_parameters(spec.model, degrees.pp, degrees.pp_virtual, degrees.tp,
                                  degrees.coordinates(rank)["pp"]))


@functools.lru_cache(maxsize=1024)
def _local_parameters(model: ModelConfig, pp: int, virtual: int, tp: int,
                      stage: int) -> tuple[tuple[str, tuple[int, ...]], ...]:
    return tuple((name, tensor_parallel_slice(name, shape, tp)) for name, shape in _stage_parameters(model, pp,
                                                                                                   virtual, stage))


def local_elements(spec: RunSpec) -> int:
    """Elements of rank 0's local parameters: what its data-parallel collectives move."""
    return sum(math.prod(shape) for shape in local_parameters(spec).values())


def gathered_bytes_per_element(spec: RunSpec) -> int:
    """Bytes per parameter element FSDP2 gathers: 16 bits under train.fsdp_mixed_precision, else fp32."""
    return HALF if spec.train.fsdp_mixed_precision else FP32


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


def part_of(spec: RunSpec) -> Part:
    """What rank 0's data-parallel collectives move (config.methods)."""
    return Part(local_elements(spec), len(rank_blocks(spec, 0)), root_share(spec), gathered_bytes_per_element(spec))


def activation_bytes(spec: RunSpec, rows: int) -> int:
    """The hidden states [rows, context, width] of `rows` sequences in the precision's compute dtype."""
    m = spec.model
    return rows * m.n_positions * m.n_embd * compute_bytes(spec.precision)
