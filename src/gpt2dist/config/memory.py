"""A rank's memory, predicted before launch: will a configuration fit?

The model state (parameters, gradients, AdamW's moments, Apex O2's fp32 master copies) is counted tensor by
tensor from the parameters the strategy's description says rank 0 holds; collect sets it beside every run's
measured state (training/metrics.py counts the same tensors), where it agrees to the byte on the reference
studies. Activations, logits and communication buffers are an estimate for CUDA's peak allocated memory from what
the training program keeps (Kept): this engine's read from its code and held to one H200's eager runs of GPT-2 small
(docs/reference/h200-1gpu, where the terms below for the eager head, autocast's weight copies, Apex's float32 GELU
and layer norms, DDP's buckets and one rank's buffers were found: in sample, not yet held to another GPU run), other
programs' held to the peaks their authors published (forecast/published.py).
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

from gpt2dist.config.geometry import gathered_bytes, gathered_bytes_per_element, local_elements, local_parameters, \
    rank_blocks
from gpt2dist.config.schema import ALL_FORWARDS_FIRST, RunSpec
from gpt2dist.config.sizes import parameter_shapes, weight_decayed
from gpt2dist.config.methods import HOROVOD_ENGINE, TORCH_DDP
from gpt2dist.config.strategies import degrees_of, describe
from gpt2dist.config.units import APEX_PRECISIONS, FP32, HALF, compute_bytes

STEP_BYTES = 4  # AdamW keeps its step count as one float32 tensor per parameter tensor
# What a GPU's allocations may take of its memory: the CUDA context and the caching allocator's fragmentation take
# the rest (torch.cuda.max_memory_allocated, which the prediction stands for, counts neither)
USABLE_SHARE = 0.9
GIB = 2**30


@dataclass(frozen=True)
class Kept:
    """What a training program holds at the step's peak beside the model state, per token: the activations a block
    keeps for backward (bytes in units of the width: on the full width, and on the widths tensor parallelism splits),
    a checkpointed block's input instead where backward recomputes the block, the attention scores' bytes per
    element where they are materialised, the head's bytes per vocabulary entry, and what else it holds: a copy of the
    gradients in DDP's buckets, 16-bit copies of the weights through forward (autocast's cache), in bytes per
    parameter; and whether tensor parallelism splits the logits over the vocabulary."""

    width: float
    split: float
    checkpointed: float
    scores: float = 0.0
    head: float = 0.0
    gradient_buckets: bool = False
    weight_copies: float = 0.0
    vocab_split: bool = False  # tensor parallelism splits the head's logits over the vocabulary (Megatron's)
    # with fp32 master weights (precision apex-O2), their fp32 gradients held through backward (Megatron's main_grad
    # buffers); Apex O2 makes them only at its last micro-step's unscale, when no activation is held
    master_gradients: bool = True


def engine_kept(spec: RunSpec) -> Kept:
    """This engine's: per block the q/k/v input and output (1 + 3 widths), the attention output (1), the MLP input
    (1), its 4x-wide output before and after GELU (4 + 4) in the compute dtype, q/k/v, the attention output and both
    MLP activations (12) split by tensor parallelism, and the two layer norms' inputs (the residual stream: float32,
    16-bit where Apex O2 casts the whole model); Apex O1 runs GELU in float32, so its 4x-wide input is kept in
    float32; no attention scores (SDPA's fused kernels). The head, per token and vocabulary entry: eager, its
    backward holds three float32 tensors at once (the saved log-softmax, the gradient nll_loss hands it and the
    gradient of its input); compiled (train.compile), the logits in the compute dtype with their float32 log-softmax
    and its gradient; chunked (train.head_loss_chunk_tokens, see head_bytes), one chunk's the same. Eager, autocast
    and Apex O1 keep a 16-bit copy of every weight through forward. Checkpointed, each block's float32 input."""
    element = compute_bytes(spec.precision)
    residual = HALF if spec.precision == "apex-O2" else FP32
    gelu_input = 4 * (FP32 - element) if spec.precision == "apex-O1" else 0
    eager = not spec.train.compile or spec.precision in APEX_PRECISIONS  # Apex never compiles (training/precision.py)
    whole_eager_head = eager and not spec.train.head_loss_chunk_tokens
    return Kept(width=2 * element + 2 * residual, split=12 * element + gelu_input, checkpointed=FP32,
                head=3 * FP32 if whole_eager_head else element + 2 * FP32,
                weight_copies=HALF if eager and element == HALF and spec.precision != "apex-O2" else 0.0,
                master_gradients=False)


@dataclass(frozen=True)
class Memory:
    """Bytes at the step's peak: the model state of one rank (predict says which), activations on the busiest
    device."""

    params: int
    grads: int
    optimizer: int
    activations: int  # one forward pass's kept activations and its logits
    buffers: int  # communication buffers and gathered parameters

    @property
    def state(self) -> int:
        return self.params + self.grads + self.optimizer

    @property
    def peak(self) -> int:
        return self.state + self.activations + self.buffers


def held_shapes(spec: RunSpec) -> list[tuple[int, ...]]:
    """The parameter tensors rank 0 holds, by local shape (rank 0 holds the largest share): its pipeline stage's,
    tensor-parallel slices of them, then the method's share (FSDP cuts each local tensor along dim 0)."""
    method, ranks = describe(spec.strategy).method, degrees_of(spec).dp_shard
    return [method.held(shape, ranks) for shape in local_parameters(spec).values()]


def optimizer_shapes(spec: RunSpec, rank: int = 0) -> list[tuple[int, ...]]:
    """The parameter tensors whose AdamW state `rank` holds: those it holds, or under a partitioned optimizer
    (ZeRO-1) its partition's."""
    if not describe(spec.strategy).method.optimizer_sharded:
        return held_shapes(spec)
    shares = optimizer_partition(spec)
    return shares[rank] if rank < len(shares) else []


def busiest_rank(spec: RunSpec) -> int:
    """The rank holding the most model state: rank 0 unless the optimizer's partition says otherwise (GPT-2
    medium over 4 ZeRO-1 ranks leaves 0.96% more elements with another)."""
    if not describe(spec.strategy).method.optimizer_sharded:
        return 0
    held = [sum(math.prod(shape) for shape in shapes) for shapes in optimizer_partition(spec)]
    return held.index(max(held))


def optimizer_partition(spec: RunSpec) -> list[list[tuple[int, ...]]]:
    """The shares of torch's ZeroRedundancyOptimizer partition, rank by rank: per parameter group, largest tensor
    first, each tensor whole to the rank holding the fewest elements so far. Ranks past the list hold none: with
    more ranks than tensors, each tensor goes to an empty rank of its own, the lowest-numbered, so a planner asking
    about a million ranks (or 10^11: recommend --gpus took 12 GB) counts only as many."""
    shapes = list(parameter_shapes(spec.model).values())
    ranks = min(spec.nproc, len(shapes))
    shares: list[list[tuple[int, ...]]] = [[] for _ in range(ranks)]
    # (elements held, rank): the heap's top is the emptiest rank, the lowest-numbered among equals, as torch's
    # sizes.index(min(sizes)) picks it, in log time
    emptiest = [(0, rank) for rank in range(ranks)]
    for decayed in (True, False):  # the loop's two groups, in its order
        for shape in sorted((s for s in shapes if weight_decayed(len(s)) == decayed), key=math.prod, reverse=True):
            held, rank = emptiest[0]
            heapq.heapreplace(emptiest, (held + math.prod(shape), rank))
            shares[rank].append(shape)
    return shares


def engine_buffer_bytes(spec: RunSpec, grads: int) -> int:
    """This engine's communication memory (`grads`: the rank's gradient bytes). With one rank torch still wraps the
    model, so FSDP2 gathers and DDP's buckets exist (Horovod, with nothing to fuse, allocates no fusion buffer); and
    where DDP accumulates, the micro-steps under no_sync give autograd's own gradients beside the buckets (zero_grad
    set them to None) until the last micro-step's hooks copy them in: one more copy of the gradients."""
    engine = describe(spec.strategy).engine
    if engine is HOROVOD_ENGINE and spec.nproc == 1:
        return 0
    accumulated = grads if engine is TORCH_DDP and degrees_of(spec).grad_accum_steps > 1 else 0
    return buffer_bytes(spec) + accumulated


def buffer_bytes(spec: RunSpec) -> int:
    """Device memory a method's communication takes beyond the model state (an estimate). Under FSDP2 (the torch
    path, ddp's replicas in a split too) the gathered parameters: two blocks' and the root's, or every block's
    where they are kept from forward to backward (ZeRO-2); Horovod's fusion buffer; none under torch's DDP, whose
    buckets are the gradients themselves (gradient_as_bucket_view)."""
    description = describe(spec.strategy)
    if not description.method.data_parallel:
        return 0
    if description.engine.gathers:
        if description.method.reshard_after_forward:
            return gathered_bytes(spec)
        return local_elements(spec) * gathered_bytes_per_element(spec)
    return description.engine.buffer_bytes


def model_state(spec: RunSpec, rank: int = 0) -> tuple[int, int, int]:
    """Parameter, gradient and optimizer bytes `rank` holds, as training/metrics.model_state_bytes counts rank 0's."""
    held, stepped = held_shapes(spec), optimizer_shapes(spec, rank)
    elements, stepped_elements = (sum(math.prod(shape) for shape in shapes) for shapes in (held, stepped))
    # Apex O2: the model in fp16, AdamW stepping fp32 copies; their fp32 gradients exist only from the last micro-
    # step's unscale to the step (Apex clears them then), when no activation is held
    master = spec.precision == "apex-O2"
    weight = HALF if master else FP32
    params = elements * weight
    grads = elements * weight
    optimizer = stepped_elements * (2 + master) * FP32 + len(stepped) * STEP_BYTES
    return params, grads, optimizer


def activation_bytes_kept(spec: RunSpec, kept: Kept | None = None) -> int:
    """One forward pass's kept activations and logits on the busiest device (an estimate; see the module doc), of
    this engine or of the program `kept` describes. A pipeline's first stage keeps its blocks' activations for every
    micro-batch in flight; its last stage keeps one micro-batch's and the logits; the larger counts."""
    kept = kept or engine_kept(spec)
    m, rows = spec.model, spec.train.micro_batch_size  # rows per device
    degrees = degrees_of(spec)
    tp = degrees.tp
    per_layer = m.n_positions * (m.n_embd * (kept.width + kept.split / tp)
                                 + m.n_head // tp * m.n_positions * kept.scores)
    recomputed = 0
    if spec.train.activation_checkpointing == "block":
        # each block keeps its input; backward computes one block's activations again at a time
        per_layer, recomputed = m.n_positions * m.n_embd * kept.checkpointed, per_layer
    stages = degrees.pp
    if stages == 1:
        return round(rows * (m.n_layer * per_layer + recomputed)
                     + head_bytes(spec, rows, kept.head, kept.vocab_split))
    in_flight, virtual = degrees.pipeline_micro_batches, degrees.pp_virtual
    if spec.train.pipeline_schedule != ALL_FORWARDS_FIRST:
        in_flight = min(in_flight, stages)  # the first rank runs one forward per rank ahead of its first backward
    # interleaving holds (stages - 1) / (stages x virtual) more (Narayanan et al. 2021, section 2.2)
    interleaving = 1 + (stages - 1) / (stages * virtual) if virtual > 1 else 1
    first = rows * (in_flight * len(rank_blocks(spec, 0)) * per_layer * interleaving + recomputed)
    last = (rows * (len(rank_blocks(spec, stages - 1)) * per_layer + recomputed)
            + head_bytes(spec, rows, kept.head, kept.vocab_split))
    return round(max(first, last))


def head_bytes(spec: RunSpec, rows: int, per_entry: float, vocab_split: bool = False) -> int:
    """The head's part of `rows` rows' peak: `per_entry` bytes per token and vocabulary entry (this engine's: its
    logits in the compute dtype, the float32 log-softmax kept for backward and its gradient); with
    train.head_loss_chunk_tokens, one chunk's only, and the two gradients the chunked loss keeps instead (the hidden
    states' in float32, the head weight's float32 sum)."""
    m, chunk = spec.model, spec.train.head_loss_chunk_tokens
    tokens = rows * m.n_positions
    if not chunk:
        return round(tokens * m.vocab_size / (degrees_of(spec).tp if vocab_split else 1) * per_entry)
    return round(min(chunk, tokens) * m.vocab_size * per_entry + tokens * m.n_embd * FP32
                 + m.vocab_size * m.n_embd * FP32)


def predict(spec: RunSpec, *, busiest: bool = True, kept: Kept | None = None) -> Memory:
    """The busiest rank's bytes (what must fit on every GPU); with busiest=False rank 0's, which every collected
    run measures; of this engine, or of the program `kept` describes."""
    params, grads, optimizer = model_state(spec, busiest_rank(spec) if busiest else 0)
    buffers = (buffer_bytes(spec) if spec.nproc > 1 else 0) if kept else engine_buffer_bytes(spec, grads)
    kept = kept or engine_kept(spec)
    master = spec.precision == "apex-O2"
    elements = params // (HALF if master else FP32)
    grads += elements * FP32 * (master and kept.master_gradients)
    buffers += round(elements * (kept.weight_copies + FP32 * (kept.gradient_buckets and spec.nproc > 1)))
    return Memory(params, grads, optimizer, activation_bytes_kept(spec, kept), buffers)


def usable_bytes(memory_gb: float) -> float:
    """What a GPU of `memory_gb` GB leaves a run's allocations (USABLE_SHARE of it)."""
    return memory_gb * 1e9 * USABLE_SHARE


def with_checkpointed_blocks(spec: RunSpec) -> RunSpec:
    """The same run with train.activation_checkpointing=block."""
    return spec.model_copy(update={"train": spec.train.model_copy(update={"activation_checkpointing": "block"})})


def overflow(spec: RunSpec, memory_gb: float) -> str | None:
    """Why the run will not fit a GPU of `memory_gb` GB by the prediction, and whether recomputing each block's
    activations would make it fit; None where it fits."""
    peak, usable = predict(spec).peak, usable_bytes(memory_gb)
    if peak <= usable:
        return None
    said = (f"predicted peak {peak / GIB:.1f} GiB per GPU, {USABLE_SHARE:.0%} of a {memory_gb:g} GB GPU is "
            f"{usable / GIB:.1f} GiB")
    if spec.train.activation_checkpointing == "none" and predict(with_checkpointed_blocks(spec)).peak <= usable:
        said += "; it fits with train.activation_checkpointing=block"
    return said
