"""What a strategy does at run time: process placement, how model and optimizer are wrapped, and
how gradients meet. The training loop calls only these methods and never names a strategy; what a
strategy is before it runs (launcher, layout, rules) is its description in config.strategies."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
from torch import nn

from gpt2dist.config.schema import RunSpec
from gpt2dist.config.strategies import degrees_of, describe
from gpt2dist.system.hardware import device_index
from gpt2dist.training.model import TokenLoss, lm_loss
from gpt2dist.training.precision import Precision

log = logging.getLogger(__name__)
OptimizerFactory = Callable[[nn.Module], torch.optim.Optimizer]


@dataclass(frozen=True)
class Placement:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    # This process's replica and the number of replicas: which share of the global batch it reads.
    # Ranks that split one replica (tensor or pipeline parallel) read the same rows.
    data_rank: int = 0
    data_world: int = 1


class Strategy:
    """Defaults describe one process with one replica; subclasses override what differs."""

    compile_conflict: str | None = None  # why train.compile cannot apply under this wrapping; None: it can
    # DCP keys optimizer state by parameter name by driving the optimizer through torch's API
    # (zero_grad(set_to_none=True), step()); a strategy whose optimizer rejects that (Horovod's) takes
    # torch's positional optimizer.state_dict() instead, which every rank then holds whole.
    dcp_drives_optimizer: bool = True
    # Whether all parameters are tensors of one kind (plain, or DTensors on one mesh), as AdamW's
    # foreach and fused kernels need: they take all parameters as one list.
    uniform_parameters: bool = True
    # Whether `forward` runs backward too (a pipeline's schedule interleaves both over its micro-batches)
    schedules_backward: bool = False

    def __init__(self, spec: RunSpec):
        self.spec = spec
        self.degrees = degrees_of(spec)  # the meshes and the batch's shares are built from these
        self.placement: Placement | None = None
        self.wrapping: dict = {}  # what prepare() applied, beyond the strategy's name, for run.json
        self.backend = "none"  # how gradients travel between processes, once setup() has run

    @property
    def sharded_grads(self) -> bool:
        """Whether a rank's gradients are only part of the model's (shards, stages, layer slices): a loss
        scaler must then agree with the other ranks on skipping a step (ShardedGradScaler)."""
        description = describe(self.spec.strategy)
        return description.shards_state or description.splits_model

    def setup(self) -> Placement:
        device = claim_gpu(0) if self.spec.device == "cuda" else torch.device("cpu")
        self.placement = Placement(rank=0, world_size=1, local_rank=0, device=device)
        return self.placement

    def prepare(self, model: nn.Module, make_optimizer: OptimizerFactory, precision: Precision):
        """Move, build the optimizer, let the strategy wrap it, and apply the precision last: Apex amp
        patches the optimizer object it is given, so that must be the one that steps."""
        model.to(self.placement.device)
        optimizer = self.wrap_optimizer(model, make_optimizer(model))
        return precision.prepare(model, optimizer)

    def wrap_optimizer(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        """The optimizer training steps, for strategies whose gradients meet inside it (Horovod)."""
        return optimizer

    def loss_module(self, model: nn.Module, precision: Precision, loss: Callable[..., torch.Tensor]) -> nn.Module:
        """What the loop calls with (inputs, targets) to get (loss sums, token counts); `loss` is
        model.head_loss, compiled or not."""
        return TokenLoss(model, precision.autocast, loss)

    def accumulate(self, model: nn.Module, last: bool) -> contextlib.AbstractContextManager:
        """Context for one micro-step's forward and backward; skips gradient sync unless last."""
        return contextlib.nullcontext()

    def forward(self, loss_module: nn.Module, inputs: torch.Tensor, targets: torch.Tensor, accum: int) -> torch.Tensor:
        """One micro-step's loss: the mean over these rows divided by accum (the loop runs its backward)."""
        return lm_loss(loss_module, inputs, targets) / accum  # the loss module enters autocast

    def evaluate_loss(self, loss_module: nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean loss of these rows, forward only."""
        return lm_loss(loss_module, inputs, targets)

    def sync_grads(self, optimizer) -> None:
        """Block until the step's gradients are reduced (Horovod reduces asynchronously)."""

    def step_context(self, optimizer) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def clip_grad_norm(self, params: Iterable[torch.Tensor], max_norm: float) -> torch.Tensor:
        """Scale gradients so their global L2 norm is at most max_norm; returns the norm before clipping.

        The loop calls this, not torch.nn.utils.clip_grad_norm_, because only the strategy knows
        whether a gradient is the whole tensor or this rank's shard of it."""
        params = [p for p in params if p.grad is not None]
        norm = self.global_grad_norm([p.grad for p in params])
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, norm, foreach=None if self.uniform_parameters else False)
        return norm

    def global_grad_norm(self, grads: list[torch.Tensor]) -> torch.Tensor:
        """L2 norm over all gradients; here every rank holds full, already-reduced gradients."""
        return torch.nn.utils.get_total_norm(grads)

    def all_reduce_mean(self, value: torch.Tensor) -> torch.Tensor:
        return value

    def all_reduce_sum(self, value: torch.Tensor) -> torch.Tensor:
        """The sum over ranks, in place where the backend allows (the interconnect probe's collective)."""
        return value

    def gather(self, value: object) -> list:
        """A small picklable value from every rank, in rank order, on every rank."""
        return [value]

    def local_optimizer(self, optimizer) -> torch.optim.Optimizer:
        """The optimizer whose state this rank holds (ZeRO-1's steps this rank's partition)."""
        return optimizer

    def state_module(self, model: nn.Module) -> nn.Module:
        """The module whose state dict is checkpointed (DCP understands DDP and FSDP wrappers)."""
        return model

    def full_state_dict(self, model: nn.Module, optimizer, precision: Precision) -> tuple[dict, dict]:
        """Unsharded model state keyed by parameter name; the optimizer's keyed by name too where the precision
        allows it (precision.optimizer_state_by_name), else torch's positional form."""
        # here, not at import: torch's checkpoint package costs every process about two seconds of start-up
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
            get_optimizer_state_dict,
        )

        options = StateDictOptions(full_state_dict=True, cpu_offload=self.placement.world_size > 1)
        module = self.state_module(model)
        model_state = get_model_state_dict(module, options=options)
        if self.dcp_drives_optimizer and precision.optimizer_state_by_name:
            return model_state, get_optimizer_state_dict(module, optimizer, options=options)
        return model_state, optimizer.state_dict()

    def load_full_state_dict(self, model: nn.Module, optimizer, precision: Precision, model_state: dict,
                             optim_state: dict) -> None:
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        options = StateDictOptions(full_state_dict=True)
        module = self.state_module(model)
        set_model_state_dict(module, model_state, options=options)
        if self.dcp_drives_optimizer and precision.optimizer_state_by_name:
            set_optimizer_state_dict(module, optimizer, optim_state, options=options)
        else:
            precision.load_optimizer_state_dict(optimizer, optim_state)

    def placement_record(self) -> dict:
        """Where the run's processes ran and how their gradients travelled, for run.json."""
        return {"world_size": self.placement.world_size, "device": str(self.placement.device), "backend": self.backend}

    def barrier(self) -> None:
        """Wait for every rank."""

    def teardown(self) -> None:
        """Release communication resources."""


def claim_gpu(local_rank: int) -> torch.device:
    """This rank's GPU by the shared rule, made current so NCCL and bare `.cuda()` calls land on it."""
    index = device_index(local_rank, torch.cuda.device_count())
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def optimizer_order(model, optimizer) -> list[str]:
    """The model's parameter names in the order torch's positional optimizer state numbers them."""
    name_of = {id(parameter): name for name, parameter in model.named_parameters()}
    return [name_of[id(parameter)] for group in optimizer.param_groups for parameter in group["params"]]


def rekeyed(optim_state: dict, key: dict) -> dict:
    """An optimizer state dict with each parameter's key (a position, or a name) replaced by key[old one]."""
    return {"state": {key[old]: state for old, state in optim_state["state"].items()},
            "param_groups": [{**group, "params": [key[old] for old in group["params"]]}
                             for group in optim_state["param_groups"]]}


def log_wrapping(strategy: Strategy, detail: str) -> None:
    """One log line saying what a strategy applied (rank 0 only; others log warnings only)."""
    log.info("%s: %s", strategy.spec.strategy, detail)
