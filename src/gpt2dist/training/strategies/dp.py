"""torch.nn.DataParallel, the study's "single parameter server".

One process; each forward scatters the micro-batch over nproc GPUs and reduces gradients
on GPU 0. The replicated module is the model together with its loss (TokenLoss), so each
replica reduces its own logits and only loss sums and token counts are gathered on GPU 0.
Without CUDA it degenerates to one CPU device, which run.json records
(placement.degenerate), so the code path still runs in CI.
"""

from torch import nn

from gpt2dist.training.model import TokenLoss
from gpt2dist.training.strategies.base import Strategy, log_wrapping


class DataParallel(Strategy):
    compile_conflict = ("DataParallel copies the module onto each device at every forward, and a block compiled "
                        "in place would still call the original's compiled code on GPU 0")

    def loss_module(self, model, precision, loss):
        # the replica enters the run's autocast itself: worker threads would default to fp16
        loss = TokenLoss(model, precision.autocast, loss)
        if self.spec.device == "cuda":
            devices = list(range(self.spec.nproc))
            self.backend = "DataParallel scatter/gather in one process"
            log_wrapping(self, f"DataParallel over cuda:{devices}, loss computed per replica, scalars gathered on "
                               "cuda:0")
            return nn.DataParallel(loss, device_ids=devices)
        log_wrapping(self, "DataParallel without CUDA: degenerate one-device case on CPU")
        return nn.DataParallel(loss)

    def placement_record(self):
        return {**super().placement_record(), "degenerate": self.placement.device.type == "cpu"}
