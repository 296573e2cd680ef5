"""torch.nn.DataParallel, the study's "single parameter server".

One process; each forward scatters the micro-batch over nproc GPUs, gathers outputs on
GPU 0 and reduces gradients there. Without CUDA it degenerates to one CPU device, which
run.json records (placement.degenerate), so the code path still runs in CI.
"""

import torch
from torch import nn

from gpt2dist.training.strategies.base import Strategy, describe


class DataParallel(Strategy):
    name = "dp"
    compile_conflict = ("DataParallel copies the module onto each device at every forward, and a block compiled "
                        "in place would still call the original's compiled code on GPU 0")

    def prepare(self, model, make_optimizer, precision):
        model, optimizer = super().prepare(model, make_optimizer, precision)
        if self.spec.device == "cuda":
            devices = list(range(self.spec.nproc))
            describe(self, f"DataParallel over cuda:{devices}, gather on cuda:0")
            return nn.DataParallel(model, device_ids=devices), optimizer
        describe(self, "DataParallel without CUDA: degenerate one-device case on CPU")
        return nn.DataParallel(model), optimizer

    @property
    def degenerate(self) -> bool:
        return not torch.cuda.is_available()

    def rows_per_micro_batch(self) -> int:
        return self.spec.train.micro_batch_size * self.spec.nproc

    def state_module(self, model):
        return model.module
