"""FSDP2 (`fully_shard`) as the torch path's data-parallel wrapper, set by the method's record (config.methods):
over the shard ranks (fsdp, zero2), over a replicate x shard mesh (hsdp), or over a replicate-only mesh with a
shard group of one (ddp's replicas inside a split, as torchtitan replicates in more than one dimension). Each
transformer block and then the root are wrapped, so a block's parameters are gathered only while it runs; ZeRO-2
keeps them gathered from forward to backward. In a split, what is wrapped is each rank's local state: every
tensor-parallel slice (FSDP x TP, as torchtitan's 2-D), and each pipeline stage, a root of its own whose blocks
stay gathered through the stage's micro-batches (torchtitan's FSDP under a pipeline: gathering them again for
every micro-batch would multiply the all-gathers by their number).

Communication stays fp32 by default, as under DDP, so the two differ only in sharding; train.fsdp_mixed_precision
opts into FSDP2's MixedPrecisionPolicy (parameters gathered and computed in the autocast dtype, gradients reduced
in fp32)."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from gpt2dist.config.methods import HYBRID, REPLICATE, SHARD, Method
from gpt2dist.training.model import transformer_blocks

# The data-parallel mesh dimensions each way of holding the state wraps over, even those of size 1
MESH_DIMS = {REPLICATE: ("dp_replicate", "dp_shard"), SHARD: ("dp_shard",), HYBRID: ("dp_replicate", "dp_shard")}


def shard_fully(model: nn.Module, mesh: DeviceMesh | None, policy: MixedPrecisionPolicy = MixedPrecisionPolicy(),
                reshard_after_forward: bool = True) -> int:
    """fully_shard each transformer block, then the root, over `mesh` (None: all ranks; 2-D: replicate x shard,
    HSDP); returns the number of sharded modules. The last block keeps its gathered parameters after forward:
    backward needs them at once, so resharding would only gather them again (the root keeps its own by default).
    reshard_after_forward=False keeps every block's (ZeRO-2: one all-gather per forward, none in backward)."""
    blocks = transformer_blocks(model)
    modules = (*blocks, model)
    for module in modules:
        keep = not reshard_after_forward or module is blocks[-1]
        fully_shard(module, mesh=mesh, mp_policy=policy, reshard_after_forward=False if keep else None)
        if dist.get_backend() == "gloo":
            # torch 2.8's gloo reduce_scatter takes ReduceOp.AVG but sums, doubling FSDP's gradients
            # with 2 ranks; SUM plus FSDP's own division is right on every torch.
            module.set_force_sum_reduction_for_comms(True)
    return len(modules)


def wrap_stages(stages: list[nn.Module], method: Method, mesh: DeviceMesh | None, pipelined: bool,
                param_dtype: torch.dtype | None) -> tuple[dict, str]:
    """FSDP2 on each stage as the method's settings say (`mesh`: its data-parallel dimensions, None for every rank;
    `param_dtype`: train.fsdp_mixed_precision's, None for fp32 throughout); what run.json records of it and the
    log line."""
    reshard = method.reshard_after_forward and not pipelined
    if method.state == REPLICATE:  # the whole local state on each replica: its all-gathers run over a group of one
        modules = sum(shard_fully(stage, mesh, reshard_after_forward=reshard) for stage in stages)
        return ({"data_parallel": "replicate: FSDP2 over the data-parallel ranks x 1", "fully_shard_modules": modules},
                f"replicas as FSDP2 over a mesh of {mesh.size()} x 1, {modules} modules")
    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32) if param_dtype else \
        MixedPrecisionPolicy()  # no casts: fp32 all-gather and reduce-scatter
    wrapping = {
        "fully_shard_modules": sum(shard_fully(stage, mesh=mesh, policy=policy, reshard_after_forward=reshard)
                                   for stage in stages),
        "param_dtype": str(policy.param_dtype or torch.float32).removeprefix("torch."),
        "reduce_dtype": str(policy.reduce_dtype or policy.param_dtype or torch.float32).removeprefix("torch."),
    }
    if mesh is not None:
        wrapping["mesh"] = dict(zip(mesh.mesh_dim_names, mesh.shape))
    return wrapping, (f"fully_shard on {wrapping['fully_shard_modules'] - len(stages)} blocks + {len(stages)} root(s), "
                      f"mesh {wrapping.get('mesh', 'flat')}, reshard after forward {reshard}, params "
                      f"{wrapping['param_dtype']}, reduce {wrapping['reduce_dtype']}")
