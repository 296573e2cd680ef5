"""Horovod: ring all-reduce through hvd.DistributedOptimizer, launched by horovodrun.

Gradients are reduced asynchronously from backward hooks after `backward_passes_per_step`
micro-steps, so the loop must `synchronize()` before unscaling or clipping and then step
inside `skip_synchronize()`. Optimizer state is not broadcast: every rank builds the same
seeded model and loads the same checkpoint, and hvd.broadcast_optimizer_state would take
a zero-gradient AdamW step on a fresh optimizer (weight decay and a bias-correction step
that the single-process reference never takes).
"""

import torch

from gpt2dist.errors import UsageError
from gpt2dist.training.strategies.base import Placement, Strategy, claim_gpu, describe


def import_horovod():
    try:
        import horovod.torch as hvd
    except ImportError as exc:
        raise UsageError(
            f"horovod is not importable ({exc}); install it with containers/install_horovod.sh"
        ) from None
    return hvd


class Horovod(Strategy):
    name = "horovod"
    launcher = "horovodrun"

    def setup(self) -> Placement:
        self.hvd = hvd = import_horovod()
        hvd.init()
        device = claim_gpu(hvd.local_rank()) if self.spec.device == "cuda" else torch.device("cpu")
        self.placement = Placement(hvd.rank(), hvd.size(), hvd.local_rank(), device)
        return self.placement

    def prepare(self, model, make_optimizer, precision):
        hvd = self.hvd
        model, optimizer = super().prepare(model, make_optimizer, precision)
        optimizer = hvd.DistributedOptimizer(
            optimizer,
            named_parameters=model.named_parameters(),
            backward_passes_per_step=self.spec.grad_accum_steps,
            op=hvd.Average,
        )
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        describe(self, f"DistributedOptimizer, world {hvd.size()}, accumulation {self.spec.grad_accum_steps}")
        return model, optimizer

    def sync_grads(self, optimizer):
        optimizer.synchronize()

    def step_context(self, optimizer):
        return optimizer.skip_synchronize()

    def all_reduce_mean(self, value):
        return self.hvd.allreduce(value, op=self.hvd.Average)

    def barrier(self):
        self.hvd.barrier()

    def teardown(self):
        self.hvd.shutdown()
