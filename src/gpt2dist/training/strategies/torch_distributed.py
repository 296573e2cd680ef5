"""Shared process-group plumbing for the torchrun-launched strategies (ddp, fsdp)."""

import os

import torch
import torch.distributed as dist

from gpt2dist.config import DEFAULT_PORT
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
        MASTER_PORT=str(DEFAULT_PORT + int(os.environ.get("SLURM_JOB_ID", "0")) % 1000),
    )


class TorchDistributed(Strategy):
    launcher = "torchrun"

    def setup(self) -> Placement:
        _env_from_slurm_tasks()
        cuda = self.spec.device == "cuda"
        local_rank = int(os.environ.get("LOCAL_RANK", 0))
        device = claim_gpu(local_rank) if cuda else torch.device("cpu")
        dist.init_process_group(backend="nccl" if cuda else "gloo")
        self.backend = dist.get_backend()
        self.placement = Placement(dist.get_rank(), dist.get_world_size(), local_rank, device)
        return self.placement

    def all_reduce_mean(self, value):
        value = value.clone()
        dist.all_reduce(value, op=dist.ReduceOp.SUM)  # gloo has no AVG
        return value / self.placement.world_size

    def barrier(self):
        dist.barrier()

    def teardown(self):
        if dist.is_initialized():
            dist.destroy_process_group()
