"""torch's DistributedDataParallel, the study's "distributed parameter server": one process per device, each rank a
whole replica, gradients averaged by bucketed all-reduce overlapped with backward. With the method's optimizer
partitioned (zero1), DeepSpeed's stage 1 on it: torch's ZeroRedundancyOptimizer steps AdamW on each rank's
partition of the parameters (whole tensors, balanced by size) and broadcasts them.

It runs named ddp and zero1 only: inside a split ddp's replicas are FSDP2 over a replicate-only mesh (the torch
path), since torch's DDP composes with neither: under tensor parallelism it cannot hold the DTensor parameters (its
workaround, DistributedDataParallel(device_mesh=...), leaves the module without them after the first forward), and
as a pipeline stage its reducer failed its second step on gloo (torch 2.13: "rebuilt parameter indices size is not
same as original model parameters size")."""

import inspect

from torch.nn.parallel import DistributedDataParallel

from gpt2dist.config.strategies import describe
from gpt2dist.training.strategies.base import log_wrapping, optimizer_order, rekeyed
from gpt2dist.training.strategies.torch_distributed import TorchDistributed


def data_parallel(model, device) -> DistributedDataParallel:
    """DDP whose gradients are views into its all-reduce buckets: no copy between the two after each
    all-reduce. Micro-steps under no_sync still give autograd's own gradients beside the buckets until the last
    one's hooks copy them in (config/memory.py plans that copy; tests/test_memory.py shows it)."""
    return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None,
                                   gradient_as_bucket_view=True)


class DDP(TorchDistributed):
    def __init__(self, spec):
        super().__init__(spec)
        self.partitioned = describe(spec.strategy).method.optimizer_sharded  # ZeRO-1

    def data_parallel(self, part, stages, make_optimizer, precision):
        # Apex amp must patch the bare model before DDP registers its hooks.
        model, optimizer = precision.prepare(part, self.wrap_optimizer(part, make_optimizer(part)))
        wrapped = data_parallel(model, self.placement.device)
        log_wrapping(self, f"DistributedDataParallel, world {self.placement.world_size}, "
                           f"{'nccl' if self.placement.device.type == 'cuda' else 'gloo'}, accumulation "
                           f"{self.degrees.grad_accum_steps}" + (", ZeroRedundancyOptimizer" if self.partitioned else ""))
        return [wrapped], optimizer

    def accumulate(self, model, last):
        """All-reduce at the last micro-step only."""
        return super().accumulate(model, last) if last else model.no_sync()

    # -- ZeRO-1: the optimizer partitioned -----------------------------------------------------------------------
    def wrap_optimizer(self, model, optimizer):
        """Under ZeRO-1 the loop's AdamW, rebuilt to step one partition: its groups, and the settings its class takes
        (its defaults also hold ones it fixes itself, such as AdamW's decoupled_weight_decay)."""
        if not self.partitioned:
            return optimizer
        from torch.distributed.optim import ZeroRedundancyOptimizer  # here: ddp's runs need none of it

        accepted = inspect.signature(type(optimizer)).parameters
        settings = {key: value for key, value in optimizer.defaults.items() if key in accepted}
        return ZeroRedundancyOptimizer([dict(group) for group in optimizer.param_groups],
                                       optimizer_class=type(optimizer), **settings)

    def local_optimizer(self, optimizer):
        return optimizer.optim if self.partitioned else optimizer

    def full_state_dict(self, model, optimizer, precision):
        """Under ZeRO-1 the state gathered on rank 0 (consolidate_state_dict) and keyed by parameter name, as
        single's, so another strategy can continue the run."""
        if not self.partitioned:
            return super().full_state_dict(model, optimizer, precision)
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        optimizer.consolidate_state_dict(to=0)
        model_state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if self.placement.rank != 0:
            return model_state, {}
        return model_state, rekeyed(optimizer.state_dict(), dict(enumerate(optimizer_order(model.module, optimizer))))

    def load_full_state_dict(self, model, optimizer, precision, model_state, optim_state):
        if not self.partitioned:
            return super().load_full_state_dict(model, optimizer, precision, model_state, optim_state)
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        set_model_state_dict(model, model_state, options=StateDictOptions(full_state_dict=True))
        positions = {name: position for position, name in enumerate(optimizer_order(model.module, optimizer))}
        optimizer.load_state_dict(rekeyed(optim_state, positions))
        # the wrapper keeps a copy of what it loaded beside its local optimizer's, which steps: drop it
        optimizer.state.clear()
