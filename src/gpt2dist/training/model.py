"""GPT-2 from transformers, built from our ModelConfig, plus the numbers MFU needs."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from gpt2dist.config import ModelConfig

if TYPE_CHECKING:
    from transformers import GPT2LMHeadModel


def build_model(cfg: ModelConfig, *, seed: int, eos_id: int) -> GPT2LMHeadModel:
    """Seeded init on CPU, so every rank and every strategy starts from identical weights."""
    # Imported here: transformers takes seconds to import, and the launcher, which imports this
    # module through the strategies, never builds a model.
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        n_layer=cfg.n_layer,
        n_head=cfg.n_head,
        n_embd=cfg.n_embd,
        n_positions=cfg.n_positions,
        vocab_size=cfg.vocab_size,
        resid_pdrop=cfg.dropout,
        embd_pdrop=cfg.dropout,
        attn_pdrop=cfg.dropout,
        bos_token_id=eos_id,
        eos_token_id=eos_id,
        use_cache=False,
        attn_implementation="sdpa",
    )
    torch.manual_seed(seed)
    model = GPT2LMHeadModel(config)
    linearize(model)
    return model


def linearize(model: nn.Module) -> None:
    """Replace transformers' Conv1D (weight stored in x out) with nn.Linear holding the same values
    transposed. Tensor parallelism's DTensor styles accept nn.Linear only; every strategy converts,
    so all of them start from the same weights in the same layout."""
    from transformers.pytorch_utils import Conv1D

    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, Conv1D):
                weight = child.weight  # on the meta device too, where a model is only measured
                linear = nn.utils.skip_init(nn.Linear, child.nx, child.nf, device=weight.device, dtype=weight.dtype)
                with torch.no_grad():
                    linear.weight.copy_(child.weight.t())
                    linear.bias.copy_(child.bias)
                setattr(parent, name, linear)


def transformer_blocks(model: GPT2LMHeadModel) -> list[nn.Module]:
    return list(model.transformer.h)


def compile_blocks(model: GPT2LMHeadModel) -> None:
    """Compile each block in place: works the same before DDP, Horovod or FSDP2 wrapping."""
    for block in transformer_blocks(model):
        block.compile()


class TokenLoss(nn.Module):
    """The model and its next-token cross-entropy as one module, returning (loss sum, token count).

    DataParallel gathers whatever its module returns onto device 0: returning the loss rather
    than logits keeps each replica's [rows, T, vocab] logits on its own GPU and gathers two
    numbers per device. Autocast is entered here, inside the replica, because DataParallel's
    worker threads inherit "autocast on" but not its dtype (pytorch#125186): a bf16 run
    would otherwise compute in fp16 without a loss scaler.
    """

    def __init__(self, model: nn.Module, autocast: Callable[[], AbstractContextManager]):
        super().__init__()
        self.model, self.autocast = model, autocast

    def forward(self, inputs: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        with self.autocast():
            logits = self.model(input_ids=inputs, use_cache=False, return_dict=False)[0]
            total = F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1), reduction="sum")
        # shape [1], not a scalar: DataParallel's gather concatenates these without a warning
        return total.float().reshape(1), targets.new_full((1,), targets.numel())


def mean_loss(loss_sums: torch.Tensor, token_counts: torch.Tensor) -> torch.Tensor:
    """Per-token mean over all replicas: weighting by tokens keeps it exact for uneven chunks."""
    return loss_sums.sum() / token_counts.sum()


def lm_loss(loss: nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy of a batch through a TokenLoss (or DataParallel over one)."""
    return mean_loss(*loss(inputs, targets))


def non_embedding_params(cfg: ModelConfig) -> int:
    """N in 6N + 12LHQT: all parameters except position embeddings (the head is tied to wte)."""
    d, layers = cfg.n_embd, cfg.n_layer
    per_block = 12 * d * d + 13 * d  # qkv + proj + 2 MLP matmuls with biases, 2 LayerNorms
    return cfg.vocab_size * d + layers * per_block + 2 * d  # token embedding, blocks, final LayerNorm


def flops_per_token(cfg: ModelConfig) -> float:
    """Training FLOPs per token (forward + backward), nanoGPT/PaLM estimate: 6N + 12*L*H*Q*T."""
    head_dim = cfg.n_embd // cfg.n_head
    return 6 * non_embedding_params(cfg) + 12 * cfg.n_layer * cfg.n_head * head_dim * cfg.n_positions
