"""GPT-2 built from our ModelConfig, and its next-token loss."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from gpt2dist.config.schema import ModelConfig, TrainConfig

if TYPE_CHECKING:
    from gpt2dist.training.gpt2 import GPT2


# The head's matrix product runs over the vocabulary rounded up to this (50257 -> 50304): the tensor cores'
# tiles and 16-byte aligned rows want it; the extra logits are cut off before the loss, never predicted.
VOCAB_MULTIPLE = 64


def build_model(cfg: ModelConfig, *, seed: int) -> GPT2:
    """Seeded init on CPU, so every rank and every strategy starts from identical weights."""
    from gpt2dist.training.gpt2 import GPT2

    torch.manual_seed(seed)
    model = GPT2(cfg)
    model.lm_head = DeferredHead(model.transformer.wte.weight)
    return model


class DeferredHead(nn.Module):
    """GPT-2's head, tied to the token embedding, whose product with the hidden states is left to the loss
    (head_loss): the model's forward returns the final hidden states, and the logits exist only inside the
    loss, which can then run as one compiled graph that never keeps a float32 copy of them. Its parameter
    keeps the name `lm_head.weight`, as in transformers' GPT-2."""

    def __init__(self, weight: nn.Parameter):
        super().__init__()
        self.weight = weight

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden


def head_loss(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Sum over these positions of the next-token cross-entropy of the tied head's logits, in float32.

    The product runs over the vocabulary padded with zero rows to a multiple of VOCAB_MULTIPLE; the
    padding's logits are cut off before the softmax. Compiled (train.compile), the upcast, softmax and
    their backward fuse into the reads of the 16-bit logits: no float32 copy of them is stored."""
    vocab = weight.shape[0]
    padding = -vocab % VOCAB_MULTIPLE
    if hidden.dtype != weight.dtype and not torch.is_autocast_enabled(hidden.device.type):
        # Apex O2 keeps the model in float16 and casts its forward's outputs to float32
        hidden = hidden.to(weight.dtype)
    logits = F.linear(hidden, F.pad(weight, (0, 0, 0, padding)) if padding else weight)[..., :vocab]
    return F.cross_entropy(logits.float().reshape(-1, vocab), targets.reshape(-1), reduction="sum")


class _ChunkedHeadLoss(torch.autograd.Function):
    """head_loss over `chunk` tokens at a time, with its gradients computed in the forward pass, chunk by chunk:
    only one chunk's logits exist at any time, and backward scales the two gradients kept (the hidden states'
    and the head's) by the loss's. The arithmetic per token is head_loss's: the product in the compute dtype
    over the padded vocabulary, the softmax in float32 over the real tokens only."""

    @staticmethod
    def forward(ctx, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, chunk: int,
                dtype: torch.dtype) -> torch.Tensor:
        vocab = weight.shape[0]
        low = weight.to(dtype)
        padded = F.pad(low, (0, 0, 0, -vocab % VOCAB_MULTIPLE))
        rows, targets = hidden.reshape(-1, hidden.shape[-1]).to(dtype), targets.reshape(-1)
        grad_rows = torch.empty_like(rows)
        grad_weight = torch.zeros(vocab, weight.shape[1], dtype=torch.float32, device=weight.device)
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        for start in range(0, rows.shape[0], chunk):
            part, wanted = rows[start:start + chunk], targets[start:start + chunk]
            logits = (part @ padded.T)[:, :vocab].float()
            log_probs = logits.log_softmax(dim=-1)
            total += F.nll_loss(log_probs, wanted, reduction="sum")
            grad_logits = log_probs.exp_()  # d(sum of -log p[target]) / d logits: softmax minus the one-hot target
            grad_logits[torch.arange(len(wanted), device=wanted.device), wanted] -= 1
            grad_logits = grad_logits.to(dtype)
            grad_rows[start:start + chunk] = grad_logits @ low
            grad_weight += grad_logits.T @ part  # the product in the compute dtype, the sum over chunks in float32
        ctx.save_for_backward(grad_rows.reshape(hidden.shape).to(hidden.dtype), grad_weight.to(weight.dtype))
        return total

    @staticmethod
    def backward(ctx, grad_total: torch.Tensor):
        grad_hidden, grad_weight = ctx.saved_tensors
        return grad_hidden * grad_total, grad_weight * grad_total, None, None, None


def chunked_head_loss(chunk: int) -> Callable[..., torch.Tensor]:
    """head_loss that never holds more than `chunk` tokens' logits (train.head_loss_chunk_tokens): at GPT-2's
    vocabulary the full logits of a micro-batch are 65 times its hidden states, and their float32 softmax more."""

    def loss(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        device = hidden.device.type
        if torch.is_autocast_enabled(device):
            dtype = torch.get_autocast_dtype(device)
        else:  # Apex O2's float16 head, or no reduced precision at all: the head's own dtype
            dtype = weight.dtype
        with torch.autocast(device, enabled=False):
            if torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad):
                return _ChunkedHeadLoss.apply(hidden, weight, targets, chunk, dtype)
            # evaluation: the same chunks, no gradients to compute
            rows, low, targets = hidden.reshape(-1, hidden.shape[-1]).to(dtype), weight.to(dtype), targets.reshape(-1)
            return sum(head_loss(rows[start:start + chunk], low, targets[start:start + chunk])
                       for start in range(0, len(rows), chunk))

    return loss


def head_loss_of(train: TrainConfig, compiled: bool) -> Callable[..., torch.Tensor]:
    """The run's head loss: chunked where train.head_loss_chunk_tokens says so, else whole (compiled or not)."""
    if train.head_loss_chunk_tokens:
        return chunked_head_loss(train.head_loss_chunk_tokens)
    return compiled_head_loss() if compiled else head_loss


def transformer_blocks(model: nn.Module) -> list[nn.Module]:
    """The model's blocks in order: GPT-2's list of them, a pipeline rank's part's (a ModuleDict by block) or a
    pipeline stage's (its `blocks`)."""
    blocks = model.blocks if isinstance(getattr(model, "blocks", None), nn.ModuleList) else model.transformer.h
    return list(blocks.values()) if isinstance(blocks, nn.ModuleDict) else list(blocks)


def checkpoint_blocks(model: GPT2) -> None:
    """Activation checkpointing per block: the block's input kept, its insides recomputed in backward."""
    for block in transformer_blocks(model):
        block.checkpointed = True


def compile_blocks(model: GPT2) -> None:
    """Compile each block in place, whole (fullgraph: a graph break is an error, not a silent return to
    eager code); works the same before DDP, Horovod or FSDP2 wrapping."""
    for block in transformer_blocks(model):
        block.compile(fullgraph=True)


def compiled_head_loss() -> Callable[..., torch.Tensor]:
    """head_loss as one compiled graph."""
    return torch.compile(head_loss, fullgraph=True)


def compile_whole(loss: nn.Module, cuda_graphs: bool) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """The forward with its loss as one graph (train.compile_whole_model), fullgraph and with static shapes, so that
    a resumed run, whose first call may be another shape's, compiles the same kernels (with dynamic ones its sums
    were rounded otherwise, 5e-7 apart at step 5 after a resume). Its steps run under deterministic_algorithms.
    With cuda_graphs, inductor's CUDA graph trees replay it (static shapes are what a graph needs anyway): each call
    starts a new step of theirs, as no backward is pending then, so a replay may overwrite the previous micro-step's
    outputs, which the loop has read by then."""
    return torch.compile(loss, fullgraph=True, dynamic=False, mode="reduce-overhead" if cuda_graphs else None)


@contextmanager
def deterministic_algorithms() -> Iterator[None]:
    """torch's deterministic algorithms for a whole-model compiled step: without them two uninterrupted CPU runs of
    the same seed ended apart (the gradient norm off in its last bit at 6 of 12 steps), as a resumed run did. Not
    the embedding backward's atomic adds in inductor's code (left to torch's kernel, the runs still parted), nor
    MKL's alignment-dependent paths (MKL_CBWR changed nothing), nor the kernels inductor chooses (deterministic
    while compiling only, they parted): a kernel the step calls at run time. For the block only, what was set
    comes back after: bench/mfu.py measures today's engine beside this one in the same process."""
    before = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before, warn_only=warn_only)


class TokenLoss(nn.Module):
    """The model and its next-token cross-entropy as one module, returning (loss sum, token count).

    DataParallel gathers whatever its module returns onto device 0: returning the loss rather
    than logits keeps each replica's [rows, T, vocab] logits on its own GPU and gathers two
    numbers per device. Autocast is entered here, inside the replica, because DataParallel's
    worker threads inherit "autocast on" but not its dtype (pytorch#125186): a bf16 run
    would otherwise compute in fp16 without a loss scaler.
    """

    def __init__(self, model: nn.Module, autocast: Callable[[], AbstractContextManager],
                 loss: Callable[..., torch.Tensor] = head_loss):
        super().__init__()
        self.model, self.autocast, self.loss = model, autocast, loss

    def forward(self, inputs: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        with self.autocast():
            hidden = self.model(inputs)
            total = self.loss(hidden, head_weight(self.model), targets)
        # shape [1], not a scalar: DataParallel's gather concatenates these without a warning
        return total.reshape(1), targets.new_full((1,), targets.numel())


def head_weight(model: nn.Module) -> torch.Tensor:
    """The tied head's weight as the model holds it now (through a DDP-style wrapper's `module`)."""
    return getattr(model, "module", model).lm_head.weight


def mean_loss(loss_sums: torch.Tensor, token_counts: torch.Tensor) -> torch.Tensor:
    """Per-token mean over all replicas: weighting by tokens keeps it exact for uneven chunks."""
    return loss_sums.sum() / token_counts.sum()


def lm_loss(loss: nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy of a batch through a TokenLoss (or DataParallel over one)."""
    return mean_loss(*loss(inputs, targets))

