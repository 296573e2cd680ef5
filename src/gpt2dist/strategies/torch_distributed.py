"""Shared process-group plumbing for the torchrun-launched strategies (ddp, fsdp)."""

import os

import torch
import torch.distributed as dist

from gpt2dist.strategies.base import Placement, Strategy


class TorchDistributed(Strategy):
    launcher = "torchrun"

    def setup(self) -> Placement:
        cuda = self.spec.device == "cuda"
        local_rank = int(os.environ.get("LOCAL_RANK", 0))
        if cuda:
            torch.cuda.set_device(local_rank)
        dist.init_process_group(backend="nccl" if cuda else "gloo")
        device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
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
