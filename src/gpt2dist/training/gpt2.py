"""GPT-2 (Radford et al. 2019) as plain torch modules: token ids in, final hidden states out.

The modules and parameter names are those of transformers' GPT-2 (`transformer.wte`, `transformer.h.3.attn.c_attn`,
`lm_head`, ...), with its initialisation (normal 0.02, residual projections scaled by 1/sqrt(2 x layers)) and
its arithmetic (pre-LayerNorm blocks, tanh GELU, scaled dot-product attention). Written here instead of
imported: transformers' import costs every rank process about 2.5 s of CPU before it trains (most of a small
study's start-up on 2 cores), and its forward builds an attention mask and reads position ids back to the
host on every call. Linear weights are stored out x in (nn.Linear), not in x out as transformers' Conv1D:
tensor parallelism's DTensor styles take nn.Linear only."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from gpt2dist.config.schema import ModelConfig

INIT_STD = 0.02
LAYER_NORM_EPS = 1e-5


class Attention(nn.Module):
    """Causal self-attention over heads of `head_dim`; the head count follows from c_attn's output, so a
    tensor-parallel rank holding a slice of the heads runs the same code."""

    def __init__(self, width: int, heads: int, dropout: float):
        super().__init__()
        self.head_dim = width // heads
        self.c_attn = nn.Linear(width, 3 * width)  # q, k and v side by side
        self.c_proj = nn.Linear(width, width)
        self.attn_dropout = dropout
        self.resid_dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows, positions, _ = x.shape
        q, k, v = (part.view(rows, positions, -1, self.head_dim).transpose(1, 2)
                   for part in self.c_attn(x).chunk(3, dim=-1))
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.attn_dropout if self.training else 0.0,
                                           is_causal=True)  # no mask tensor: the fused kernels apply
        return self.resid_dropout(self.c_proj(y.transpose(1, 2).reshape(rows, positions, -1)))


class MLP(nn.Module):
    def __init__(self, width: int, dropout: float):
        super().__init__()
        self.c_fc = nn.Linear(width, 4 * width)
        self.c_proj = nn.Linear(4 * width, width)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(F.gelu(self.c_fc(x), approximate="tanh")))


class Block(nn.Module):
    """Pre-LayerNorm attention and MLP. `checkpointed` (train.activation_checkpointing: block) keeps only the
    block's input for backward, which computes the block again from it."""

    checkpointed = False

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd, eps=LAYER_NORM_EPS)
        self.attn = Attention(cfg.n_embd, cfg.n_head, cfg.dropout)
        self.ln_2 = nn.LayerNorm(cfg.n_embd, eps=LAYER_NORM_EPS)
        self.mlp = MLP(cfg.n_embd, cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.checkpointed and torch.is_grad_enabled():
            # non-reentrant: it composes with FSDP2's and DTensor's hooks, and restores the RNG state for dropout
            return checkpoint(self._residuals, x, use_reentrant=False)
        return self._residuals(x)

    def _residuals(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class Body(nn.Module):
    """transformers' `GPT2Model`: embeddings, blocks and the final LayerNorm."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.n_positions, cfg.n_embd)
        self.drop = nn.Dropout(cfg.dropout)
        self.h = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd, eps=LAYER_NORM_EPS)


class GPT2(nn.Module):
    """`lm_head` is set by the caller (model.DeferredHead, tied to the token embedding)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.transformer = Body(cfg)
        self.lm_head: nn.Module = nn.Identity()
        self._initialise(cfg.n_layer)

    @torch.no_grad()
    def _initialise(self, n_layer: int) -> None:
        residual_std = INIT_STD / math.sqrt(2 * n_layer)  # two residual additions per block
        for name, module in self.named_modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                module.weight.normal_(0.0, residual_std if name.endswith("c_proj") else INIT_STD)
            if isinstance(module, nn.Linear):
                module.bias.zero_()

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        body = self.transformer
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        hidden = body.drop(body.wte(input_ids) + body.wpe(positions))
        for block in body.h:
            hidden = block(hidden)
        return self.lm_head(body.ln_f(hidden))
