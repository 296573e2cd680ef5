"""Tensor parallelism (Megatron-style, on DTensor) for every split with a tensor-parallel degree (tp, fsdp-tp,
ddp-tp2, tp2-pp2, ...), applied by torch_distributed to the blocks a rank computes: each block's attention heads and
MLP columns are split over the mesh's tp group. q/k/v and the first MLP matrix are column-parallel (each rank
computes its own heads and columns, no communication), the two output projections row-parallel (partial sums
all-reduced): one all-reduce per sub-layer in forward and one in backward. Embeddings, LayerNorms and the tied head
stay whole on every rank of the group, which all see the same rows. The data-parallel method then wraps what this
split (FSDP shards every local tensor over the data-parallel ranks).

GPT-2 fuses q, k and v into one [3 x width, width] matrix. A column split of it would give rank 0 all of q and
half of k, so its rows are reordered before the split ([q_r, k_r, v_r] on rank r) and put back in GPT-2's order
in checkpoints: a checkpoint is the same as `single`'s."""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from gpt2dist.training.model import transformer_blocks

FUSED_QKV = ".attn.c_attn."  # parameters (and their optimizer state) stored in the reordered layout


def qkv_order(width: int, tp: int) -> torch.Tensor:
    """Row order putting rank r's q, k and v heads next to each other: [q_0 k_0 v_0 q_1 k_1 v_1 ...]."""
    rows = torch.arange(3 * width).view(3, tp, width // tp)  # (q|k|v, rank, rows of that rank's heads)
    return rows.transpose(0, 1).reshape(-1)


def shard_blocks(model: nn.Module, mesh: DeviceMesh) -> int:
    """Split each block's attention and MLP over `mesh` in place; returns the number of blocks."""
    tp = mesh.size()
    blocks = transformer_blocks(model)
    for block in blocks:
        attn = block.attn
        with torch.no_grad():
            order = qkv_order(attn.c_proj.in_features, tp)
            attn.c_attn.weight.copy_(attn.c_attn.weight[order])
            attn.c_attn.bias.copy_(attn.c_attn.bias[order])
        parallelize_module(block, mesh, {
            "attn.c_attn": ColwiseParallel(),
            "attn.c_proj": RowwiseParallel(),
            "mlp.c_fc": ColwiseParallel(),
            "mlp.c_proj": RowwiseParallel(),
        })
    return len(blocks)


def reorder_qkv(state: dict, tp: int, *, to_gpt2: bool) -> None:
    """Reorder the fused q/k/v rows of every tensor in `state` (a model or per-parameter optimizer
    state dict, keyed by name), in place."""
    for name, value in state.items():
        if FUSED_QKV not in name:
            continue
        if isinstance(value, dict):  # optimizer state of one parameter: step, exp_avg, exp_avg_sq
            for key, tensor in value.items():
                if torch.is_tensor(tensor) and tensor.dim() >= 1:
                    value[key] = _permute_rows(tensor, tp, to_gpt2)
        else:
            state[name] = _permute_rows(value, tp, to_gpt2)


def _permute_rows(tensor: torch.Tensor, tp: int, to_gpt2: bool) -> torch.Tensor:
    order = qkv_order(tensor.shape[0] // 3, tp)
    return tensor[torch.argsort(order)] if to_gpt2 else tensor[order]
