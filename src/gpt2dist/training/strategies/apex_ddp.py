"""Apex's DistributedDataParallel (`apex.parallel.DistributedDataParallel`), the data-parallel
wrapper of Bai 2022's "Distributed Parameter Server + Apex" row (its published code pairs it
with amp O2). One process per GPU like torch DDP; gradients are averaged in buckets of
`message_size` elements on a side CUDA stream, from hooks on the gradient accumulators.

CUDA only: Apex's wrapper schedules every all-reduce on CUDA streams. amp.initialize patches
the bare model first (Apex's documented order), then the wrapper hooks it. Gradient
accumulation switches the wrapper's all-reduce off for all but the last micro-step, Apex's
equivalent of torch DDP's no_sync()."""

import contextlib

from gpt2dist.training.optional import require_apex_parallel
from gpt2dist.training.strategies.base import log_wrapping
from gpt2dist.training.strategies.torch_distributed import TorchDistributed


class ApexDDP(TorchDistributed):
    compile_conflict = ("Apex's wrapper hooks the gradient accumulators of the parameters it sees at wrap time "
                        "and rebuilds its buckets from hook order, which a compiled block's backward changes")

    def data_parallel(self, part, stages, make_optimizer, precision):
        model, optimizer = precision.prepare(part, self.wrap_optimizer(part, make_optimizer(part)))
        wrapped = require_apex_parallel().DistributedDataParallel(model)
        self.wrapping = {"wrapper": "apex.parallel.DistributedDataParallel", "message_size": wrapped.message_size}
        log_wrapping(self, f"apex.parallel.DistributedDataParallel, world {self.placement.world_size}, "
                           f"accumulation {self.degrees.grad_accum_steps}")
        return [wrapped], optimizer

    def accumulate(self, model, last):
        if last:
            model.enable_allreduce()
        else:
            model.disable_allreduce()
        return contextlib.nullcontext()

    def state_module(self, model):
        return model.module  # torch's state-dict helpers know torch DDP's wrapper, not Apex's
