"""DistributedDataParallel, the study's "distributed parameter server": one process per device, each data-parallel
rank a whole replica of its (local) state, gradients averaged by bucketed all-reduce overlapped with backward.

In a split (ddp-tp2, ddp-pp2, ...) the replicas are FSDP2 over a replicate-only mesh, the data-parallel ranks x a
shard group of 1: the same replicated state and averaged gradients, reduced block by block in backward, as
torchtitan replicates in more than one dimension. torch's DDP composes with neither: under tensor parallelism it
cannot hold the DTensor parameters (its workaround, DistributedDataParallel(device_mesh=...), leaves the module
without them after the first forward), and as a pipeline stage its reducer failed its second step on gloo
(torch 2.13: "rebuilt parameter indices size is not same as original model parameters size")."""

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

    @property
    def dp_dims(self):
        """FSDP2's replicate-only mesh in a split: the replicas x a shard group of one."""
        return ("dp_replicate", "dp_shard") if self.splits_model else ()

    def data_parallel(self, part, stages, make_optimizer, precision):
        device, degrees = self.placement.device, self.degrees
        if self.splits_model:
            from gpt2dist.training.strategies.fsdp import shard_fully

            # the whole local state on each replica: its all-gathers run over a group of one; a pipeline's stages
            # keep their blocks gathered through their micro-batches
            mesh = self.mesh["dp_replicate", "dp_shard"]
            modules = sum(shard_fully(stage, mesh, reshard_after_forward=self.pipeline is None) for stage in stages)
            self.wrapping |= {"data_parallel": "replicate: FSDP2 over the data-parallel ranks x 1",
                              "fully_shard_modules": modules}
            log_wrapping(self, f"replicas as FSDP2 over a mesh of {degrees.dp} x 1, {modules} modules")
            return stages, make_optimizer(part)
        # Apex amp must patch the bare model before DDP registers its hooks.
        model, optimizer = precision.prepare(part, self.wrap_optimizer(part, make_optimizer(part)))
        wrapped = data_parallel(model, device)
        log_wrapping(self, f"DistributedDataParallel, world {self.placement.world_size}, "
                           f"{'nccl' if device.type == 'cuda' else 'gloo'}, accumulation {degrees.grad_accum_steps}")
        return [wrapped], optimizer

    def accumulate(self, model, last):
        """All-reduce at the last micro-step only (a pipeline's stages decide that themselves)."""
        if self.pipeline:
            return super().accumulate(model, last)
        if self.splits_model:  # FSDP2's replicas
            model.set_requires_gradient_sync(last)
            return super().accumulate(model, last)
        return super().accumulate(model, last) if last else model.no_sync()
