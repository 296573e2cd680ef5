"""ZeRO stage 1 (DeepSpeed's optimizer state partitioning) on DDP: a module of its own, so that ddp's runs do
not import torch's distributed optimizers."""

import inspect

from torch.distributed.optim import ZeroRedundancyOptimizer

from gpt2dist.training.strategies.base import optimizer_order, rekeyed
from gpt2dist.training.strategies.ddp import DDP


class ZeRO1(DDP):
    """DeepSpeed's stage 1 with torch's ZeroRedundancyOptimizer: DDP all-reduces whole gradients, then each rank
    steps AdamW on its partition of the parameters (whole tensors, balanced by size) and broadcasts them.
    Checkpoints gather the state on rank 0 (consolidate_state_dict) and key it by parameter name, as single's,
    so another strategy can continue the run."""

    name = "zero1"

    def wrap_optimizer(self, model, optimizer):
        """The loop's AdamW, rebuilt to step one partition: its groups, and the settings its class takes (its
        defaults also hold ones it fixes itself, such as AdamW's decoupled_weight_decay)."""
        accepted = inspect.signature(type(optimizer)).parameters
        settings = {key: value for key, value in optimizer.defaults.items() if key in accepted}
        return ZeroRedundancyOptimizer([dict(group) for group in optimizer.param_groups],
                                       optimizer_class=type(optimizer), **settings)

    def local_optimizer(self, optimizer):
        return optimizer.optim

    def full_state_dict(self, model, optimizer, precision):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        optimizer.consolidate_state_dict(to=0)
        model_state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if self.placement.rank != 0:
            return model_state, {}
        return model_state, rekeyed(optimizer.state_dict(), dict(enumerate(optimizer_order(model.module, optimizer))))

    def load_full_state_dict(self, model, optimizer, precision, model_state, optim_state):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        set_model_state_dict(model, model_state, options=StateDictOptions(full_state_dict=True))
        positions = {name: position for position, name in enumerate(optimizer_order(model.module, optimizer))}
        optimizer.load_state_dict(rekeyed(optim_state, positions))
        # the wrapper keeps a copy of what it loaded beside its local optimizer's, which steps: drop it
        optimizer.state.clear()
