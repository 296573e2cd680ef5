"""Horovod: ring all-reduce through hvd.DistributedOptimizer, launched by horovodrun.

Gradients are reduced asynchronously from backward hooks after `backward_passes_per_step`
micro-steps, so the loop must `synchronize()` before unscaling or clipping and then step
inside `skip_synchronize()`. Optimizer state is not broadcast: every rank builds the same
seeded model and loads the same checkpoint, and hvd.broadcast_optimizer_state would take
a zero-gradient AdamW step on a fresh optimizer (weight decay and a bias-correction step
that the single-process reference never takes).

With Apex, amp.initialize must patch the DistributedOptimizer itself (the maintainers'
recipe, horovod#1089, apex#1057): Horovod builds a new optimizer object, so wrapping one
that amp had patched loses amp's per-optimizer state. Under O2 the model's cast to fp16
replaces the gradient accumulators Horovod hooked, so `synchronize()` reduces every
gradient after backward: the same result, without overlap.
"""

import torch

from gpt2dist.training.ledger import comm_wait
from gpt2dist.training.optional import import_horovod
from gpt2dist.training.strategies.base import (
    Placement,
    Strategy,
    claim_gpu,
    log_wrapping,
    optimizer_order,
    rekeyed,
)


class Horovod(Strategy):
    # DCP's loader calls optimizer.zero_grad(set_to_none=True), which Horovod's zero_grad() rejects; every rank
    # holds the whole optimizer, so torch's positional state dict is exact, and checkpoints key it by parameter
    # name through the model's own names (as every other strategy's), so another strategy may continue it.
    dcp_drives_optimizer = False

    def full_state_dict(self, model, optimizer, precision):
        model_state, positional = super().full_state_dict(model, optimizer, precision)
        if not precision.optimizer_state_by_name:
            return model_state, positional
        return model_state, rekeyed(positional, dict(enumerate(optimizer_order(model, optimizer))))

    def load_full_state_dict(self, model, optimizer, precision, model_state, optim_state):
        if precision.optimizer_state_by_name:
            positions = {name: position for position, name in enumerate(optimizer_order(model, optimizer))}
            optim_state = rekeyed(optim_state, positions)
        super().load_full_state_dict(model, optimizer, precision, model_state, optim_state)

    def setup(self) -> Placement:
        self.hvd = hvd = import_horovod()
        hvd.init()
        controller = "gloo" if hvd.gloo_enabled() else "mpi"
        cuda_ops = self.spec.device == "cuda" and hvd.nccl_built()
        self.backend = f"horovod {controller}" + (" + nccl" if cuda_ops else "")
        device = claim_gpu(hvd.local_rank()) if self.spec.device == "cuda" else torch.device("cpu")
        self.placement = Placement(hvd.rank(), hvd.size(), hvd.local_rank(), device, data_rank=hvd.rank(),
                                   data_world=hvd.size())
        return self.placement

    def wrap_optimizer(self, model, optimizer):
        return self.hvd.DistributedOptimizer(
            optimizer,
            named_parameters=model.named_parameters(),
            backward_passes_per_step=self.degrees.grad_accum_steps,
            op=self.hvd.Average,
        )

    def prepare(self, model, make_optimizer, precision):
        hvd = self.hvd
        model, optimizer = super().prepare(model, make_optimizer, precision)
        # The live parameters (GPT-2 has no buffers), not model.state_dict(), which under Apex O2 holds fp32 copies.
        hvd.broadcast_parameters(dict(model.named_parameters()), root_rank=0)
        log_wrapping(self, f"DistributedOptimizer, world {hvd.size()}, accumulation {self.degrees.grad_accum_steps}")
        return model, optimizer

    def sync_grads(self, optimizer):
        with comm_wait():
            optimizer.synchronize()

    def step_context(self, optimizer):
        return optimizer.skip_synchronize()

    def all_reduce_mean(self, value):
        with comm_wait():
            return self.hvd.allreduce(value, op=self.hvd.Average)

    def all_reduce_sum(self, value):
        return self.hvd.allreduce_(value, op=self.hvd.Sum)

    def gather(self, value):
        return self.hvd.allgather_object(value)

    def barrier(self):
        self.hvd.barrier()

    def teardown(self):
        self.hvd.shutdown()

