"""Shared process-group plumbing for the torchrun-launched strategies (ddp, fsdp, tp, pp, fsdp-tp)."""

import math
import os

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor, Replicate

from gpt2dist.system.allocation import rendezvous_port
from gpt2dist.training.strategies.base import Placement, Strategy, claim_gpu


def _env_from_slurm_tasks() -> None:
    """Ranks started as SLURM tasks (`srun -n N python -m gpt2dist.launch.worker`), not by torchrun:
    take rank, world size and the rendezvous from SLURM's variables."""
    if "RANK" in os.environ or "SLURM_PROCID" not in os.environ:
        return
    import hostlist

    first_node = hostlist.expand_hostlist(os.environ["SLURM_JOB_NODELIST"])[0]
    os.environ.update(
        RANK=os.environ["SLURM_PROCID"],
        WORLD_SIZE=os.environ["SLURM_NTASKS"],
        LOCAL_RANK=os.environ["SLURM_LOCALID"],
        MASTER_ADDR=first_node,
        MASTER_PORT=str(rendezvous_port()),
    )


class TorchDistributed(Strategy):
    """One process per device, started by torchrun or as SLURM tasks, in one torch process group."""

    def setup(self) -> Placement:
        _env_from_slurm_tasks()
        cuda = self.spec.device == "cuda"
        local_rank = int(os.environ.get("LOCAL_RANK", 0))
        device = claim_gpu(local_rank) if cuda else torch.device("cpu")
        dist.init_process_group(backend="nccl" if cuda else "gloo")
        self.backend = dist.get_backend()
        rank, world = dist.get_rank(), dist.get_world_size()
        shares = self.degrees.batch_shares
        # ranks that split one replica are consecutive (tensor and pipeline ranks are the mesh's inner dimensions)
        self.placement = Placement(rank, world, local_rank, device, data_rank=rank // (world // shares),
                                   data_world=shares)
        return self.placement

    def device_mesh(self, *dims: str) -> DeviceMesh:
        """The run's device mesh over the named degrees (Degrees' fields: dp_replicate, dp_shard, tp), outermost
        first, each as large as the run's degrees say."""
        return init_device_mesh(self.placement.device.type, tuple(getattr(self.degrees, dim) for dim in dims),
                                mesh_dim_names=dims)

    def all_reduce_mean(self, value):
        value = value.clone()
        dist.all_reduce(value, op=dist.ReduceOp.SUM)  # gloo has no AVG
        return value / self.placement.world_size

    def all_reduce_sum(self, value):
        dist.all_reduce(value, op=dist.ReduceOp.SUM)
        return value

    def gather(self, value):
        gathered = [None] * self.placement.world_size
        dist.all_gather_object(gathered, value)
        return gathered

    def barrier(self):
        dist.barrier()

    def teardown(self):
        if dist.is_initialized():
            dist.destroy_process_group()


def sharded_grad_norm(grads: list[torch.Tensor], device: torch.device) -> torch.Tensor:
    """Global L2 norm of gradients that may be DTensors on any mesh (or plain tensors every rank holds).

    Each rank adds its local part's squared norm divided by how many ranks hold that same part, so one
    SUM all-reduce over all ranks counts every element exactly once."""
    world = dist.get_world_size()
    squared = torch.zeros((), device=device, dtype=torch.float32)
    for grad in grads:
        holders = world
        if isinstance(grad, DTensor):
            if any(p.is_partial() for p in grad.placements):
                grad = grad.redistribute(placements=[Replicate() if p.is_partial() else p for p in grad.placements])
            mesh = grad.device_mesh
            # replicated mesh dimensions multiply the holders (FSDP's _StridedShard over a TP shard is no `Shard`)
            holders = world // mesh.size() * math.prod(
                mesh.size(dim) for dim, p in enumerate(grad.placements) if p.is_replicate())
            grad = grad.to_local()
        squared += grad.detach().float().square().sum().to(device) / holders
    dist.all_reduce(squared, op=dist.ReduceOp.SUM)
    return squared.sqrt()
