"""GPT-2's sizes from its configuration alone: parameter counts and training FLOPs per token, for the
traffic model, MFU and planning, without building the model."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpt2dist.config.schema import ModelConfig


def non_embedding_params(m: ModelConfig) -> int:
    """N in 6N + 12LHQT: all parameters except position embeddings (the head is tied to wte)."""
    d, layers = m.n_embd, m.n_layer
    per_block = 12 * d * d + 13 * d  # qkv + proj + 2 MLP matmuls with biases, 2 LayerNorms
    return m.vocab_size * d + layers * per_block + 2 * d  # token embedding, blocks, final LayerNorm


def parameter_count(m: ModelConfig) -> int:
    """GPT-2's parameters, the head tied to the token embedding."""
    return non_embedding_params(m) + m.n_positions * m.n_embd


def split_parameter_count(m: ModelConfig) -> int:
    """What tensor parallelism splits: q/k/v and the first MLP matrix with their biases, and both projections'
    matrices (their biases stay whole)."""
    d = m.n_embd
    return m.n_layer * (3 * d * d + 3 * d + 4 * d * d + 4 * d + d * d + 4 * d * d)


def flops_per_token(m: ModelConfig) -> float:
    """Training FLOPs per token (forward + backward), nanoGPT/PaLM estimate: 6N + 12*L*H*Q*T."""
    head_dim = m.n_embd // m.n_head
    return 6 * non_embedding_params(m) + 12 * m.n_layer * m.n_head * head_dim * m.n_positions
