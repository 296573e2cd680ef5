"""Model construction and the FLOP count that MFU is computed from."""

import torch

from gpt2dist.config.schema import ModelConfig, TrainConfig
from gpt2dist.config.sizes import flops_per_token, non_embedding_params
from gpt2dist.training.loop import lr_at
from gpt2dist.training.model import build_model, checkpoint_blocks

from conftest import TINY_PRESET

GPT2_SMALL = ModelConfig(n_layer=12, n_head=12, n_embd=768, n_positions=1024, vocab_size=50257)


def test_parameter_count_is_gpt2_smalls():
    with torch.device("meta"):
        model = build_model(GPT2_SMALL, seed=0)
    total = sum(p.numel() for p in model.parameters())  # tied head counted once
    assert total == 124_439_808  # OpenAI's GPT-2 small checkpoint (transformers' "gpt2")
    assert non_embedding_params(GPT2_SMALL) == total - model.transformer.wpe.weight.numel()


def test_gpt2_small_flops_per_token():
    # reference: about 855 MFLOP per token for GPT-2 124M at T=1024
    assert abs(flops_per_token(GPT2_SMALL) / 1e6 - 855) < 2


def test_seeded_init_is_identical():
    cfg = ModelConfig(**TINY_PRESET["model"])
    a, b = build_model(cfg, seed=1), build_model(cfg, seed=1)
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))


def test_lr_schedule_warmup_then_cosine():
    cfg = TrainConfig(**{**TINY_PRESET["train"], "max_steps": 110, "lr_warmup_steps": 10, "lr": 1.0, "min_lr": 0.1})
    assert lr_at(0, cfg) == 0.1 and lr_at(9, cfg) == 1.0
    assert lr_at(10, cfg) == 1.0 and abs(lr_at(60, cfg) - 0.55) < 1e-12 and lr_at(110, cfg) == 0.1


def _saved_for_backward(model: torch.nn.Module, tokens: torch.Tensor) -> int:
    """Bytes autograd keeps from one forward of `tokens` for the backward that follows."""
    saved: dict[int, int] = {}

    def pack(tensor):
        saved[id(tensor)] = tensor.numel() * tensor.element_size()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        model(tokens).sum().backward()
    return sum(saved.values())


def test_checkpointed_blocks_keep_their_inputs_only_and_compute_the_same_gradients():
    """train.activation_checkpointing=block: a checkpointed block keeps its input for backward, not its
    activations (the control: the same model unchanged keeps several times more), and backward's recomputation
    gives the very gradients of the plain model."""
    cfg = ModelConfig(**{**TINY_PRESET["model"], "n_layer": 4})
    plain, checkpointed = build_model(cfg, seed=1), build_model(cfg, seed=1)
    checkpoint_blocks(checkpointed)
    tokens = torch.randint(0, cfg.vocab_size, (2, 32), generator=torch.Generator().manual_seed(0))
    kept_plain, kept_checkpointed = _saved_for_backward(plain, tokens), _saved_for_backward(checkpointed, tokens)
    block_input = 2 * 32 * cfg.n_embd * 4  # rows x positions x width, float32
    # the blocks' share: the plain model keeps about 14 widths per block (config.memory), the checkpointed one 1
    head_and_embeddings = kept_checkpointed - cfg.n_layer * block_input
    assert head_and_embeddings >= 0
    assert kept_plain - head_and_embeddings > 8 * (kept_checkpointed - head_and_embeddings)
    for (name, a), (_, b) in zip(plain.named_parameters(), checkpointed.named_parameters()):
        assert torch.equal(a.grad, b.grad), name
