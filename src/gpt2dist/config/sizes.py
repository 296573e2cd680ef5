"""GPT-2's sizes from its configuration alone: parameter counts and training FLOPs per token, for the
traffic model, MFU and planning, without building the model."""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping

from pydantic import ValidationError

from gpt2dist.config.schema import ModelConfig, ModelShape, validation_message
from gpt2dist.errors import UsageError

# GPT-2's four published sizes (Radford et al. 2019; transformers' gpt2, gpt2-medium, gpt2-large, gpt2-xl) by
# depth, heads and width; each read 1024 positions over a vocabulary of 50257 tokens
GPT2_SIZES = {"small": (12, 12, 768), "medium": (24, 16, 1024), "large": (36, 20, 1280), "xl": (48, 25, 1600)}


SHAPE_KEYS = ("n_layer", "n_head", "n_embd")  # what a size sets of the model


def shape_of(size: str, custom: Mapping[str, ModelShape] | None = None) -> dict[str, int]:
    """Depth, heads and width of one of GPT2_SIZES or of a size of `custom` (a study's model_sizes)."""
    custom = custom or {}
    if size in GPT2_SIZES and size in custom:
        raise UsageError(f"study.model_sizes names '{size}', which is GPT-2's {size}; give that shape another name")
    if size in custom:
        return custom[size].model_dump()
    if size in GPT2_SIZES:
        return dict(zip(SHAPE_KEYS, GPT2_SIZES[size]))
    raise UsageError(f"unknown model size '{size}' (known: {', '.join([*GPT2_SIZES, *custom])}); name one of them, or "
                     "add it to the preset's study.model_sizes with its n_layer, n_head and n_embd")


def size_words(size: str) -> str:
    """A size as tables and figures name it: 'GPT-2 medium', or 'model tiny' for a study's own."""
    return f"GPT-2 {size}" if size in GPT2_SIZES else f"model {size}"


def sized(m: ModelConfig, size: str, custom: Mapping[str, ModelShape] | None = None) -> ModelConfig:
    """`m` at a size (shape_of); its context and vocabulary stay."""
    try:
        return ModelConfig.model_validate(m.model_dump() | shape_of(size, custom))
    except ValidationError as err:
        raise UsageError(f"model size '{size}': {validation_message(err, ModelConfig, 'model')}") from None


# What tensor parallelism splits (training/strategies/tensor_parallel.py's plan): column-parallel layers (q/k/v,
# the first MLP matrix) their output rows and biases, row-parallel ones (both projections) their matrices' input
# columns, their biases staying whole
COLUMN_PARALLEL = ("attn.c_attn.weight", "attn.c_attn.bias", "mlp.c_fc.weight", "mlp.c_fc.bias")
ROW_PARALLEL = ("attn.c_proj.weight", "mlp.c_proj.weight")


def non_embedding_params(m: ModelConfig) -> int:
    """N in 6N + 12LHQT: all parameters except position embeddings (the head is tied to wte)."""
    d, layers = m.n_embd, m.n_layer
    per_block = 12 * d * d + 13 * d  # qkv + proj + 2 MLP matmuls with biases, 2 LayerNorms
    return m.vocab_size * d + layers * per_block + 2 * d  # token embedding, blocks, final LayerNorm


def parameter_count(m: ModelConfig) -> int:
    """GPT-2's parameters, the head tied to the token embedding."""
    return sum(math.prod(shape) for shape in parameter_shapes(m).values())


def parameter_shapes(m: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every parameter tensor of training/gpt2.py by name, Linear weights out x in, the head tied to wte (listed
    once): what a memory prediction divides over ranks tensor by tensor, as FSDP2 and DTensor do."""
    return dict(_parameter_shapes(m))


@functools.lru_cache(maxsize=256)  # a planner asks for the same few models' thousands of times
def _parameter_shapes(m: ModelConfig) -> tuple[tuple[str, tuple[int, ...]], ...]:
    d = m.n_embd
    block = {"ln_1.weight": (d,), "ln_1.bias": (d,), "attn.c_attn.weight": (3 * d, d), "attn.c_attn.bias": (3 * d,),
             "attn.c_proj.weight": (d, d), "attn.c_proj.bias": (d,), "ln_2.weight": (d,), "ln_2.bias": (d,),
             "mlp.c_fc.weight": (4 * d, d), "mlp.c_fc.bias": (4 * d,), "mlp.c_proj.weight": (d, 4 * d),
             "mlp.c_proj.bias": (d,)}
    shapes = {"transformer.wte.weight": (m.vocab_size, d), "transformer.wpe.weight": (m.n_positions, d)}
    for layer in range(m.n_layer):
        shapes |= {f"transformer.h.{layer}.{name}": shape for name, shape in block.items()}
    return tuple((shapes | {"transformer.ln_f.weight": (d,), "transformer.ln_f.bias": (d,)}).items())


def weight_decayed(dims: int) -> bool:
    """AdamW's first parameter group: matrices and embeddings decay, biases and LayerNorm gains do not."""
    return dims >= 2


def split_parameter_count(m: ModelConfig) -> int:
    """What tensor parallelism splits (COLUMN_PARALLEL and ROW_PARALLEL)."""
    return sum(math.prod(shape) for name, shape in parameter_shapes(m).items()
               if name.endswith(COLUMN_PARALLEL + ROW_PARALLEL))


def flops_per_token(m: ModelConfig) -> float:
    """Training FLOPs per token (forward + backward), nanoGPT/PaLM estimate: 6N + 12*L*H*Q*T."""
    head_dim = m.n_embd // m.n_head
    return 6 * non_embedding_params(m) + 12 * m.n_layer * m.n_head * head_dim * m.n_positions
