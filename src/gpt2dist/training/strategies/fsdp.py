"""Fully Sharded Data Parallel (FSDP2, `fully_shard`): parameters, gradients and optimizer state sharded over the
data-parallel ranks; each transformer block and then the root are sharded, so a block's parameters are gathered
only while it runs. Its two variants: HSDP (a 2-D mesh) and ZeRO-2 (gathered parameters kept from forward to
backward). In a split, what is sharded is each rank's local state: every tensor-parallel slice (FSDP x TP, as
torchtitan's 2-D), and each pipeline stage, a root of its own whose blocks stay gathered through the stage's
micro-batches (torchtitan's FSDP under a pipeline: gathering them again for every micro-batch would multiply the
all-gathers by their number).

Communication stays fp32 by default, as under DDP, so the two differ only in sharding;
train.fsdp_mixed_precision opts into FSDP2's MixedPrecisionPolicy (parameters gathered and
computed in the autocast dtype, gradients reduced in fp32)."""

import contextlib

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from gpt2dist.training.model import transformer_blocks
from gpt2dist.training.strategies.base import log_wrapping
from gpt2dist.training.strategies.torch_distributed import TorchDistributed


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


class FSDP(TorchDistributed):
    name = "fsdp"
    reshard_after_forward = True
    dp_dims = ("dp_shard",)

    def mesh_of_replicas(self) -> DeviceMesh | None:
        """The ranks the state is sharded over (None: all of them)."""
        return None if self.mesh is None else self.mesh["dp_shard"]

    def data_parallel(self, part, stages, make_optimizer, precision):
        # Shard first: the optimizer must be built over the sharded (DTensor) parameters.
        policy = self._mixed_precision_policy(precision)
        mesh = self.mesh_of_replicas()
        reshard = self.reshard_after_forward and self.pipeline is None
        self.wrapping |= {
            "fully_shard_modules": sum(shard_fully(stage, mesh=mesh, policy=policy, reshard_after_forward=reshard)
                                       for stage in stages),
            "param_dtype": str(policy.param_dtype or torch.float32).removeprefix("torch."),
            "reduce_dtype": str(policy.reduce_dtype or policy.param_dtype or torch.float32).removeprefix("torch."),
        }
        if mesh is not None:
            self.wrapping["mesh"] = dict(zip(mesh.mesh_dim_names, mesh.shape))
        log_wrapping(self, f"fully_shard on {self.wrapping['fully_shard_modules'] - len(stages)} blocks + "
                           f"{len(stages)} root(s), world {self.placement.world_size}, mesh "
                           f"{self.wrapping.get('mesh', 'flat')}, reshard after forward {reshard}, params "
                           f"{self.wrapping['param_dtype']}, reduce {self.wrapping['reduce_dtype']}")
        return stages, make_optimizer(part)

    def _mixed_precision_policy(self, precision) -> MixedPrecisionPolicy:
        if not self.spec.train.fsdp_mixed_precision:
            return MixedPrecisionPolicy()  # no casts: fp32 all-gather and reduce-scatter
        return MixedPrecisionPolicy(param_dtype=precision.dtype, reduce_dtype=torch.float32)

    def accumulate(self, model, last):
        if self.pipeline is None:  # a pipeline's stages decide that themselves
            model.set_requires_gradient_sync(last)
        return super().accumulate(model, last)


class HSDP(FSDP):
    """Hybrid sharding: the state sharded within groups of train.data_parallel_shard_size consecutive
    data-parallel ranks (one node's, on a cluster) and replicated across the groups; gradients are reduce-scattered
    within a group, then all-reduced across groups."""

    name = "hsdp"
    dp_dims = ("dp_replicate", "dp_shard")

    def mesh_of_replicas(self):
        return self.mesh["dp_replicate", "dp_shard"]


class ZeRO2(FSDP):
    """DeepSpeed's stage 2 on FSDP2: each block's parameters are gathered once per forward and kept until its
    backward, gradients are reduce-scattered after every micro-step (so no rank holds whole gradients) and
    the optimizer steps its shard. Stage 2 also keeps the whole parameters between steps; FSDP2 frees them
    after backward, which changes neither the traffic nor the peak."""

    name = "zero2"
    reshard_after_forward = False

    def accumulate(self, model, last):
        return contextlib.nullcontext()  # every micro-step reduces: no rank ever holds whole gradients
