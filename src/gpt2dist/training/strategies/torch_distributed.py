"""One process per device in one torch process group, for every torchrun-launched strategy, and the one path that
composes a split (config.split): on each rank, in torchtitan's order, the pipeline split at the rank's pp
coordinate, tensor parallelism on the stage's blocks, then the data-parallel method's wrapper on each stage (FSDP2
as its record's settings say: training/strategies/fsdp.py) and the pipeline's schedule over the wrapped stages.
Engines of their own (torch's DDP, Apex's) take this path's process group and override the wrapper. Activation checkpointing and compile are the loop's per-block
switches, set on the whole model before this and kept by every step of it (compile is refused under tp and pp).

The device mesh is the run's degrees (config.degrees), pp outermost, tp innermost: a tensor-parallel group is
consecutive ranks. It is built once, where the run has more than one dimension (or tensor parallelism, whose
DTensors need one); a one-dimensional run keeps the default process group, as it always had."""

from __future__ import annotations

import math
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor, Replicate

from gpt2dist.config.degrees import MESH_ORDER
from gpt2dist.config.strategies import describe
from gpt2dist.system.allocation import rendezvous_port
from gpt2dist.training.strategies.base import Placement, Strategy, claim_gpu, log_wrapping

TENSOR_PARALLEL_COMPILE = ("the attention code is compiled with the block; under DTensor it would trace the "
                           "collectives too, which this study has not validated")
PIPELINE_COMPILE = "the pipeline schedule drives each stage's forward and backward itself"


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
    """One process per device, started by torchrun or as SLURM tasks, in one torch process group; the torch path's
    engine, whose data-parallel wrapper is FSDP2 set by the method. An engine of its own overrides the wrapper
    (`data_parallel`) and takes no data-parallel mesh dimension."""

    def __init__(self, spec):
        super().__init__(spec)
        self.method = describe(spec.strategy).method
        self.fsdp2 = describe(spec.strategy).engine.gathers and self.method.data_parallel  # FSDP2 wraps the stages
        self.mesh: DeviceMesh | None = None
        self.pipeline = None  # training.strategies.pipeline_parallel.Pipeline, where the run has stages

    @property
    def dp_dims(self) -> tuple[str, ...]:
        """The data-parallel mesh dimensions the method's FSDP2 wrapper takes, even of size 1 (none where another
        engine wraps, or no method does)."""
        if not self.fsdp2:
            return ()
        from gpt2dist.training.strategies.fsdp import MESH_DIMS

        return MESH_DIMS[self.method.state]

    @property
    def compile_conflict(self) -> str | None:
        if self.degrees.pp > 1:
            return PIPELINE_COMPILE
        return TENSOR_PARALLEL_COMPILE if self.degrees.tp > 1 else None

    @property
    def uniform_parameters(self) -> bool:
        """Tensor parallelism's DTensors sit beside plain (or other-mesh) parameters."""
        return self.degrees.tp == 1

    @property
    def schedules_backward(self) -> bool:
        return self.degrees.pp > 1

    @property
    def splits_model(self) -> bool:
        return self.degrees.tp > 1 or self.degrees.pp > 1

    def setup(self) -> Placement:
        _env_from_slurm_tasks()
        cuda = self.spec.device == "cuda"
        local_rank = int(os.environ.get("LOCAL_RANK", 0))
        device = claim_gpu(local_rank) if cuda else torch.device("cpu")
        dist.init_process_group(backend="nccl" if cuda else "gloo")
        self.backend = dist.get_backend()
        rank, world = dist.get_rank(), dist.get_world_size()
        self.placement = Placement(rank, world, local_rank, device, data_rank=self.degrees.data_rank(rank),
                                   data_world=self.degrees.batch_shares)
        self.mesh = self._world_mesh(device)
        return self.placement

    def _world_mesh(self, device: torch.device) -> DeviceMesh | None:
        """The run's mesh over the dimensions above 1 and those the method's wrapper takes, outermost first; None
        where that is one dimension spanning every rank without tensor parallelism (the default group is it)."""
        sizes = self.degrees.sizes()
        dims = tuple(dim for dim in MESH_ORDER if sizes[dim] > 1 or dim in self.dp_dims)
        if len(dims) <= 1 and self.degrees.tp == 1:
            return None
        mesh = init_device_mesh(device.type, tuple(sizes[dim] for dim in dims), mesh_dim_names=dims)
        self.check_layout(mesh)
        return mesh

    def check_layout(self, mesh: DeviceMesh) -> None:
        """The mesh torch laid out is the one config.degrees describes, which the batch's shares, the pipeline's
        peers and run.json's groups follow: a rank's group along each dimension."""
        for dim in mesh.mesh_dim_names:
            expected = self.degrees.group(self.placement.rank, (dim,))
            if mesh[dim].mesh.tolist() != expected:
                raise RuntimeError(f"the device mesh's {dim} group {mesh[dim].mesh.tolist()} is not config.degrees' "
                                   f"{expected}")

    def group(self, dim: str):
        """This rank's process group along one mesh dimension (None: every rank, the default group)."""
        return None if self.mesh is None or dim not in (self.mesh.mesh_dim_names or ()) else self.mesh[dim].get_group()

    # -- the model: split, tensor parallel, data parallel, schedule ----------------------------------
    def prepare(self, model, make_optimizer, precision):
        model.to(self.placement.device)
        degrees, part = self.degrees, model
        if degrees.pp > 1:
            from gpt2dist.training.strategies.pipeline_parallel import Pipeline

            self.pipeline = Pipeline(self.spec, degrees, self.placement, model, self.group("pp"), precision.autocast)
            part = self.pipeline.part
        if degrees.tp > 1:
            from gpt2dist.training.strategies.tensor_parallel import shard_blocks

            self.wrapping |= {"tensor_parallel": degrees.tp, "parallel_blocks": shard_blocks(part, self.mesh["tp"])}
        stages = self.pipeline.stages() if self.pipeline else [part]
        wrapped, optimizer = self.data_parallel(part, stages, make_optimizer, precision)
        if self.pipeline:
            self.pipeline.schedule(wrapped)
            self.wrapping |= self.pipeline.wrapping()
        if self.splits_model:
            log_wrapping(self, ", ".join(f"{dim} {size}" for dim, size in degrees.sizes().items() if size > 1))
        return (part if self.pipeline else wrapped[0]), optimizer

    def data_parallel(self, part: nn.Module, stages: list[nn.Module], make_optimizer, precision):
        """Wrap each stage for the data-parallel method and build the optimizer over the rank's part (after the
        wrapping: FSDP2's parameters are DTensors); without a method, one replica, split, unwrapped."""
        if not self.fsdp2:
            return stages, make_optimizer(part)
        from gpt2dist.training.strategies.fsdp import wrap_stages

        dims = self.dp_dims
        mesh = None if self.mesh is None else self.mesh[dims if len(dims) > 1 else dims[0]]
        param_dtype = precision.dtype if self.spec.train.fsdp_mixed_precision else None
        wrapping, said = wrap_stages(stages, self.method, mesh, self.pipeline is not None, param_dtype)
        self.wrapping |= wrapping
        log_wrapping(self, f"{said}, world {self.placement.world_size}")
        return stages, make_optimizer(part)

    def accumulate(self, model, last):
        """FSDP2 reduces at the last micro-step only, but under ZeRO-2 at every one (no rank ever holds whole
        gradients); a pipeline's stages decide that themselves."""
        if self.pipeline is None and self.fsdp2 and not self.method.reduce_every_micro_step:
            model.set_requires_gradient_sync(last)
        return super().accumulate(model, last)

    def loss_module(self, model, precision, loss):
        return self.pipeline.loss_module(loss) if self.pipeline else super().loss_module(model, precision, loss)

    def forward(self, loss_module, inputs, targets, accum):
        if self.pipeline:
            return self.pipeline.forward(inputs, targets)
        return super().forward(loss_module, inputs, targets, accum)

    def evaluate_loss(self, loss_module, inputs, targets):
        if self.pipeline:
            return self.pipeline.evaluate_loss(inputs, targets)
        return super().evaluate_loss(loss_module, inputs, targets)

    def global_grad_norm(self, grads):
        """Where every rank holds the whole reduced gradient, its own norm; else the norm over every rank's part,
        each part counted once (the pipeline's copy of the tied embedding left out)."""
        if not (self.splits_model or describe(self.spec.strategy).shards_state):
            return super().global_grad_norm(grads)
        if self.pipeline:
            grads = self.pipeline.counted(grads)
        return sharded_grad_norm(grads, self.placement.device, stage_ranks=self.placement.world_size // self.degrees.pp)

    # -- checkpoints: single's layout ------------------------------------------------------------
    def full_state_dict(self, model, optimizer, precision):
        """A split model's state gathered into single's layout: each stage's full tensors (DTensors made whole,
        q/k/v rows back in GPT-2's order) from one rank of it, merged on rank 0; the other ranks return nothing."""
        if not self.splits_model:
            return super().full_state_dict(model, optimizer, precision)
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
            get_optimizer_state_dict,
        )

        part = self.pipeline.part if self.pipeline else model
        # without stages rank 0 alone keeps the whole; with them each stage's ranks get theirs, for rank 0 to merge
        options = StateDictOptions(full_state_dict=True, cpu_offload=self.pipeline is None)
        model_state = _on_cpu(get_model_state_dict(part, options=options))
        optim_state = get_optimizer_state_dict(part, optimizer, options=options)
        if self.pipeline is None and self.placement.rank != 0:
            return {}, {}
        optim_state = {**optim_state, "state": {name: _on_cpu(state) for name, state in optim_state["state"].items()}}
        if self.degrees.tp > 1:
            from gpt2dist.training.strategies.tensor_parallel import reorder_qkv

            reorder_qkv(model_state, self.degrees.tp, to_gpt2=True)
            reorder_qkv(optim_state["state"], self.degrees.tp, to_gpt2=True)
        if self.pipeline is None:
            return model_state, optim_state
        at = self.degrees.coordinates(self.placement.rank)
        speaks = at["tp"] == 0 and at["dp_replicate"] == 0 and at["dp_shard"] == 0  # one rank per stage sends
        parts = [None] * self.placement.world_size if self.placement.rank == 0 else None
        dist.gather_object((model_state, optim_state) if speaks else None, parts, dst=0)
        if self.placement.rank != 0:
            return {}, {}
        return self.pipeline.merged([part for part in parts if part is not None])

    def load_full_state_dict(self, model, optimizer, precision, model_state, optim_state):
        """Single's layout into the split: each rank takes its stage's tensors (the head's copy from the
        embedding), q/k/v rows in its tensor-parallel order; DCP cuts its slices and shards."""
        if not self.splits_model:
            return super().load_full_state_dict(model, optimizer, precision, model_state, optim_state)
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        part = self.pipeline.part if self.pipeline else model
        if self.pipeline:
            model_state, optim_state = self.pipeline.local_state(model_state, optim_state)
        model_state, optim_state = dict(model_state), {**optim_state, "state": dict(optim_state["state"])}
        if self.degrees.tp > 1:
            from gpt2dist.training.strategies.tensor_parallel import reorder_qkv

            reorder_qkv(model_state, self.degrees.tp, to_gpt2=False)
            reorder_qkv(optim_state["state"], self.degrees.tp, to_gpt2=False)
        options = StateDictOptions(full_state_dict=True)
        set_model_state_dict(part, model_state, options=options)
        set_optimizer_state_dict(part, optimizer, optim_state, options=options)

    def placement_record(self):
        return {**super().placement_record(), **self.degrees.layout()}

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


def _on_cpu(state: dict) -> dict:
    return {key: value.detach().cpu() if torch.is_tensor(value) else value for key, value in state.items()}


def sharded_grad_norm(grads: list[torch.Tensor], device: torch.device, stage_ranks: int | None = None) -> torch.Tensor:
    """Global L2 norm of gradients that may be DTensors on any mesh (or plain tensors that every rank of a
    pipeline stage holds alike: `stage_ranks` of them, every rank without a pipeline).

    Each rank adds its local part's squared norm divided by how many ranks hold that same part, so one
    SUM all-reduce over all ranks counts every element exactly once."""
    stage_ranks = stage_ranks or dist.get_world_size()
    squared = torch.zeros((), device=device, dtype=torch.float32)
    for grad in grads:
        holders = stage_ranks
        if isinstance(grad, DTensor):
            if any(p.is_partial() for p in grad.placements):
                grad = grad.redistribute(placements=[Replicate() if p.is_partial() else p for p in grad.placements])
            mesh = grad.device_mesh
            # replicated mesh dimensions multiply the holders (FSDP's _StridedShard over a TP shard is no `Shard`)
            holders = stage_ranks // mesh.size() * math.prod(
                mesh.size(dim) for dim, p in enumerate(grad.placements) if p.is_replicate())
            grad = grad.to_local()
        squared += grad.detach().float().square().sum().to(device) / holders
    dist.all_reduce(squared, op=dist.ReduceOp.SUM)
    return squared.sqrt()
