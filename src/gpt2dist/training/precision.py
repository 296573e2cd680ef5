"""Precision policies: how the forward is cast and how loss scaling wraps backward and step.

fp32 and bf16 need no scaling; fp16 uses torch.amp's GradScaler (ShardedGradScaler under
FSDP, so every rank agrees on skipping a step); apex-O1/O2 use NVIDIA Apex amp, the
study's mixed-precision recipe. Backward runs inside `scaled`, which unscales the gradients
as the step's last micro-step leaves it: whatever must finish before the gradients are read
(Horovod's asynchronous reductions) goes inside, after backward.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator

import torch
from torch import nn

from gpt2dist.errors import UsageError
from gpt2dist.training.optional import require_apex

_AUTOCAST_DTYPE = {"bf16": torch.bfloat16, "fp16": torch.float16}


class Precision:
    """fp32/bf16/fp16 with torch.amp; subclassed for Apex."""

    compile_conflict: str | None = None  # why train.compile cannot apply under this precision; None: it can
    # whether checkpoints key the optimizer's state by the model's parameter names (which another strategy's
    # run can continue), else torch's positional form: Apex O2 steps fp32 masters that no name maps to
    optimizer_state_by_name = True

    def __init__(self, name: str, device: torch.device, *, sharded: bool):
        self.name, self.device, self.sharded = name, device, sharded
        self.dtype = _AUTOCAST_DTYPE.get(name)
        self.scaler: torch.amp.GradScaler | None = None
        if name == "fp16":
            self._check_fp16_support()
            if sharded:
                from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

                self.scaler = ShardedGradScaler(device.type)
            else:
                self.scaler = torch.amp.GradScaler(device.type)

    @property
    def fused_optimizer(self) -> bool:
        """Whether the optimizer uses torch's fused kernel: on CUDA, where this precision's scaler allows it."""
        return self.device.type == "cuda" and self.scaler_allows_fused_optimizer

    @property
    def scaler_allows_fused_optimizer(self) -> bool:
        """False under ShardedGradScaler: its found_inf has shape (1,), which fused Adam subtracts in
        place from its shape-() step counters and fails ("output with shape [] doesn't match the
        broadcast shape [1]", seen with torch 2.11 on CUDA and 2.13 on CPU). The foreach path only
        reads found_inf to decide whether to step."""
        return not (self.name == "fp16" and self.sharded)

    def _check_fp16_support(self) -> None:
        try:
            with torch.autocast(self.device.type, dtype=torch.float16):
                torch.mm(torch.ones(2, 2, device=self.device), torch.ones(2, 2, device=self.device))
            torch.amp.GradScaler(self.device.type)
        except (RuntimeError, AssertionError) as exc:
            raise UsageError(
                f"fp16 autocast with GradScaler is not supported on {self.device.type} by torch "
                f"{torch.__version__} ({exc}); use --precision bf16"
            ) from None

    def prepare(self, model: nn.Module, optimizer: torch.optim.Optimizer):
        return model, optimizer

    def autocast(self) -> contextlib.AbstractContextManager:
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.dtype)

    @contextlib.contextmanager
    def scaled(self, loss: torch.Tensor, optimizer, *, last: bool) -> Iterator[torch.Tensor]:
        """The loss to call backward on; leaving after the step's `last` micro-step unscales the gradients
        (for clipping), which each micro-step before it leaves scaled."""
        yield self.scaler.scale(loss) if self.scaler else loss
        if last and self.scaler:
            self.scaler.unscale_(optimizer)

    def master_params(self, model: nn.Module, optimizer) -> Iterable[torch.Tensor]:
        return model.parameters()

    def step(self, optimizer) -> None:
        if self.scaler:
            self.scaler.step(optimizer)
            self.scaler.update()
        else:
            optimizer.step()

    def load_optimizer_state_dict(self, optimizer, state: dict) -> None:
        """Load torch's positional optimizer state (used where DCP cannot key it by name)."""
        optimizer.load_state_dict(state)

    def state_dict(self, optimizer) -> dict:
        return {"scaler": self.scaler.state_dict()} if self.scaler else {}

    def load_state_dict(self, state: dict, optimizer) -> None:
        if self.scaler and "scaler" in state:
            self.scaler.load_state_dict(state["scaler"])


class ApexPrecision(Precision):
    """NVIDIA Apex amp (O1: patched casts; O2: fp16 model with fp32 master weights)."""

    compile_conflict = ("Apex amp casts through Python wrappers it patches into torch functions (O1) and the "
                        "model's forward (O2), which torch.compile would break graphs on or recompile for every step")
    # O2 steps fp32 master copies that no model parameter name maps to; Apex's checkpoint recipe
    # is optimizer.state_dict() + amp.state_dict(), loaded after amp.initialize.
    optimizer_state_by_name = False

    def __init__(self, name: str, device: torch.device, *, sharded: bool):
        super().__init__(name, device, sharded=sharded)
        self.amp = require_apex()
        self.opt_level = name.split("-", 1)[1]

    def prepare(self, model, optimizer):
        return self.amp.initialize(model, optimizer, opt_level=self.opt_level, verbosity=0)

    def autocast(self):
        return contextlib.nullcontext()  # amp patched the model in prepare()

    @contextlib.contextmanager
    def scaled(self, loss, optimizer, *, last):
        # Apex's own context: it unscales on exit unless told to delay (every micro-step but the last), which is
        # why Horovod's synchronize goes inside it (Horovod's Apex recipe)
        with self.amp.scale_loss(loss, optimizer, delay_unscale=not last) as scaled:
            yield scaled

    def master_params(self, model, optimizer):
        return self.amp.master_params(optimizer)

    def step(self, optimizer):
        optimizer.step()

    def _make_master_params(self, optimizer) -> None:
        # O2 swaps its fp32 master copies into the optimizer lazily; its zero_grad() does it now, so
        # saved state loads onto fp32 tensors instead of being rounded through the fp16 parameters.
        optimizer.zero_grad()

    def load_optimizer_state_dict(self, optimizer, state):
        self._make_master_params(optimizer)
        optimizer.load_state_dict(state)

    def state_dict(self, optimizer):
        state = {"amp": self.amp.state_dict()}  # the loss scaler
        if self.opt_level == "O2":
            # The model holds fp16 roundings of the master weights; a resumed run must step the masters.
            state["master_params"] = [p.detach().cpu() for p in self.amp.master_params(optimizer)]
        return state

    def load_state_dict(self, state, optimizer):
        self.amp.load_state_dict(state["amp"])
        if "master_params" in state:
            self._make_master_params(optimizer)
            with torch.no_grad():
                for master, saved in zip(self.amp.master_params(optimizer), state["master_params"], strict=True):
                    master.copy_(saved)


def make_precision(name: str, device: torch.device, *, sharded: bool) -> Precision:
    cls = ApexPrecision if name.startswith("apex-") else Precision
    return cls(name, device, sharded=sharded)
