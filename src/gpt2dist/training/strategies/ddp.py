"""DistributedDataParallel, the study's "distributed parameter server": one process per
device, gradients averaged by bucketed all-reduce overlapped with backward."""

from torch.nn.parallel import DistributedDataParallel

from gpt2dist.training.strategies.base import log_wrapping
from gpt2dist.training.strategies.torch_distributed import TorchDistributed


def data_parallel(model, device) -> DistributedDataParallel:
    """DDP whose gradients are views into its all-reduce buckets: no copy between the two after each
    all-reduce, and no second copy of the gradients in memory."""
    return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None,
                                   gradient_as_bucket_view=True)


class DDP(TorchDistributed):
    name = "ddp"

    def prepare(self, model, make_optimizer, precision):
        # Apex amp must patch the bare model before DDP registers its hooks.
        model, optimizer = super().prepare(model, make_optimizer, precision)
        device = self.placement.device
        cuda = device.type == "cuda"
        wrapped = data_parallel(model, device)
        log_wrapping(self, f"DistributedDataParallel, world {self.placement.world_size}, "
                           f"{'nccl' if cuda else 'gloo'}, accumulation {self.degrees.grad_accum_steps}")
        return wrapped, optimizer

    def accumulate(self, model, last):
        return super().accumulate(model, last) if last else model.no_sync()

