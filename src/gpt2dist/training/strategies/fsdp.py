"""Fully Sharded Data Parallel (FSDP2, `fully_shard`): parameters, gradients and optimizer
state sharded over ranks; each transformer block and then the root are sharded, so a
block's parameters are gathered only while it runs."""

from torch.distributed.fsdp import fully_shard

from gpt2dist.training.model import transformer_blocks
from gpt2dist.training.strategies.base import describe
from gpt2dist.training.strategies.torch_distributed import TorchDistributed


class FSDP(TorchDistributed):
    name = "fsdp"

    def prepare(self, model, make_optimizer, precision):
        # Shard first: the optimizer must be built over the sharded (DTensor) parameters.
        model.to(self.placement.device)
        blocks = transformer_blocks(model)
        for block in blocks:
            fully_shard(block)
        fully_shard(model)
        describe(self, f"fully_shard on {len(blocks)} blocks + root, world {self.placement.world_size}")
        return model, make_optimizer(model)

    def accumulate(self, model, last):
        model.set_requires_gradient_sync(last)
        return super().accumulate(model, last)
