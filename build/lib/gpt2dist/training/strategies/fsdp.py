"""Fully Sharded Data Parallel (FSDP2, `fully_shard`): parameters, gradients and optimizer
state sharded over ranks; each transformer block and then the root are sharded, so a
block's parameters are gathered only while it runs.

Communication stays fp32 by default, as under DDP, so the two differ only in sharding;
train.fsdp_mixed_precision opts into FSDP2's MixedPrecisionPolicy (parameters gathered and
computed in the autocast dtype, gradients reduced in fp32)."""

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from gpt2dist.training.model import transformer_blocks
from gpt2dist.training.strategies.base import describe
from gpt2dist.training.strategies.torch_distributed import TorchDistributed, sharded_grad_norm


def shard_fully(model: nn.Module, mesh: DeviceMesh | None, policy: MixedPrecisionPolicy = MixedPrecisionPolicy()) -> int:
    """fully_shard each transformer block, then the root, over `mesh` (None: all ranks); returns the
    number of sharded modules. The last block keeps its gathered parameters after forward: backward
    needs them at once, so resharding would only gather them again (the root keeps its own by default)."""
    blocks = transformer_blocks(model)
    modules = (*blocks, model)
    for module in modules:
        fully_shard(module, mesh=mesh, mp_policy=policy, reshard_after_forward=False if module is blocks[-1] else None)
        if dist.get_backend() == "gloo":
            # torch 2.8's gloo reduce_scatter takes ReduceOp.AVG but sums, doubling FSDP's gradients
            # with 2 ranks; SUM plus FSDP's own division is right on every torch.
            module.set_force_sum_reduction_for_comms(True)
    return len(modules)


class FSDP(TorchDistributed):
    name = "fsdp"

    def prepare(self, model, make_optimizer, precision):
        # Shard first: the optimizer must be built over the sharded (DTensor) parameters.
        model.to(self.placement.device)
        policy = self._mixed_precision_policy(precision)
        self.wrapping = {
            "fully_shard_modules": shard_fully(model, mesh=None, policy=policy),
            "param_dtype": str(policy.param_dtype or torch.float32).removeprefix("torch."),
            "reduce_dtype": str(policy.reduce_dtype or policy.param_dtype or torch.float32).removeprefix("torch."),
        }
        describe(self, f"fully_shard on {self.wrapping['fully_shard_modules'] - 1} blocks + root, world {self.placement.world_size}, "
                       f"params {self.wrapping['param_dtype']}, reduce {self.wrapping['reduce_dtype']}")
        return model, make_optimizer(model)

    def _mixed_precision_policy(self, precision) -> MixedPrecisionPolicy:
        if not self.spec.train.fsdp_mixed_precision:
            return MixedPrecisionPolicy()  # no casts: fp32 all-gather and reduce-scatter
        return MixedPrecisionPolicy(param_dtype=precision.dtype, reduce_dtype=torch.float32)

    def accumulate(self, model, last):
        model.set_requires_gradient_sync(last)
        return super().accumulate(model, last)

    def global_grad_norm(self, grads):
        return sharded_grad_norm(grads, self.placement.device)
