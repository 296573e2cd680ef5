"""A rank's memory, predicted before launch: will a configuration fit?

The model state (parameters, gradients, AdamW's moments, Apex O2's fp32 master copies) is counted tensor by
tensor from the parameters the strategy's description says rank 0 holds; collect sets it beside every run's
measured state (training/metrics.py counts the same tensors), where it agrees to the byte on the reference
studies. Activations, logits and communication buffers are a textbook estimate for CUDA's peak allocated
memory, not yet checked against a GPU run: `plan` says so wherever it shows them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from gpt2dist.config.schema import ALL_FORWARDS_FIRST, RunSpec
from gpt2dist.config.strategies import FP32, HALF, compute_bytes, degrees_of, describe, rank_blocks

STEP_BYTES = 4  # AdamW keeps its step count as one float32 tensor per parameter tensor
# Per token and layer, the activations a block keeps for backward in the compute dtype, in units of the width:
# the q/k/v input and output (1 + 3), the attention output (1), the MLP input (1), its 4x-wide output before and
# after GELU (4 + 4); the attention matrix is not kept (SDPA's fused kernels). Of these, q/k/v, the attention
# output and both MLP activations (12) are split by tensor parallelism.
KEPT_WIDTHS, SPLIT_WIDTHS = 14, 12
RESIDUAL_WIDTHS = 2  # the two LayerNorms' inputs, the float32 residual stream
# What a GPU's allocations may take of its memory: the CUDA context and the caching allocator's fragmentation take
# the rest (torch.cuda.max_memory_allocated, which the prediction stands for, counts neither)
USABLE_SHARE = 0.9
GIB = 2**30


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


def model_state(spec: RunSpec, rank: int = 0) -> tuple[int, int, int]:
    """Parameter, gradient and optimizer bytes `rank` holds, as training/metrics.model_state_bytes counts rank 0's."""
    description = describe(spec.strategy)
    held, stepped = description.held_shapes(spec), description.optimizer_shapes(spec, rank)
    elements, stepped_elements = (sum(math.prod(shape) for shape in shapes) for shapes in (held, stepped))
    master = spec.precision == "apex-O2"  # the model in fp16, AdamW stepping fp32 copies with fp32 gradients
    weight = HALF if master else FP32
    params = elements * weight
    grads = elements * weight + (elements * FP32 if master else 0)
    optimizer = stepped_elements * (2 + master) * FP32 + len(stepped) * STEP_BYTES
    return params, grads, optimizer


def activation_bytes_kept(spec: RunSpec) -> int:
    """One forward pass's kept activations and logits on the busiest device (an estimate; see the module doc).
    A pipeline's first stage keeps its blocks' activations for every micro-batch in flight; its last stage
    keeps one micro-batch's and the logits; the larger counts."""
    m, element, rows = spec.model, compute_bytes(spec.precision), spec.train.micro_batch_size  # rows per device
    degrees = degrees_of(spec)
    tp = degrees.tp
    per_layer = m.n_positions * m.n_embd * ((KEPT_WIDTHS - SPLIT_WIDTHS + SPLIT_WIDTHS / tp) * element
                                            + RESIDUAL_WIDTHS * FP32)
    recomputed = 0
    if spec.train.activation_checkpointing == "block":
        # each block keeps its float32 input; backward computes one block's activations again at a time
        per_layer, recomputed = m.n_positions * m.n_embd * FP32, per_layer
    stages = degrees.pp
    if stages == 1:
        return round(rows * (m.n_layer * per_layer + recomputed) + head_bytes(spec, rows))
    in_flight, virtual = degrees.pipeline_micro_batches, degrees.pp_virtual
    if spec.train.pipeline_schedule != ALL_FORWARDS_FIRST:
        in_flight = min(in_flight, stages)  # the first rank runs one forward per rank ahead of its first backward
    # interleaving holds (stages - 1) / (stages x virtual) more (Narayanan et al. 2021, section 2.2)
    interleaving = 1 + (stages - 1) / (stages * virtual) if virtual > 1 else 1
    first = rows * (in_flight * len(rank_blocks(spec, 0)) * per_layer * interleaving + recomputed)
    last = rows * (len(rank_blocks(spec, stages - 1)) * per_layer + recomputed) + head_bytes(spec, rows)
    return round(max(first, last))


def head_bytes(spec: RunSpec, rows: int) -> int:
    """The head's part of `rows` rows' peak: their logits in the compute dtype, the float32 log-softmax kept for
    backward and its gradient; with train.head_loss_chunk_tokens, those of one chunk only, and the two gradients
    the chunked loss keeps instead (the hidden states' in float32, the head weight's float32 sum)."""
    m, element, chunk = spec.model, compute_bytes(spec.precision), spec.train.head_loss_chunk_tokens
    per_token = m.vocab_size * (element + 2 * FP32)
    tokens = rows * m.n_positions
    if not chunk:
        return tokens * per_token
    return min(chunk, tokens) * per_token + tokens * m.n_embd * FP32 + m.vocab_size * m.n_embd * FP32


def predict(spec: RunSpec, *, busiest: bool = True) -> Memory:
    """The busiest rank's bytes (what must fit on every GPU); with busiest=False rank 0's, which every collected
    run measures."""
    params, grads, optimizer = model_state(spec, describe(spec.strategy).busiest_rank(spec) if busiest else 0)
    buffers = describe(spec.strategy).buffer_bytes(spec) if spec.nproc > 1 else 0
    return Memory(params, grads, optimizer, activation_bytes_kept(spec), buffers)


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
