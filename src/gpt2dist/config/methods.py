"""Every data-parallel method, one record each, and the engines that run them, without torch.

A method says how the data-parallel ranks hold the model state, as settings of one torch path (torchtitan's
ParallelDims and Megatron's DDP config are the models): replicated or sharded over every data-parallel rank (or
sharded in groups of train.data_parallel_shard_size and replicated across them), gathered parameters kept from
forward to backward or not, gradients reduced at every micro-step or at the last, AdamW's state partitioned or
not. Its record also holds its words (for `gpt2dist strategies` and the papers' names), the combinations it
refuses, the train.* switches of its own, and, derived from those settings, its collectives on the data-parallel
group per step and how much of them hide under backward. The engine is the code that runs it: torch's one path
(FSDP2, DTensor, pipelining) or an engine of its own (torch's DistributedDataParallel, Horovod, Apex's DDP,
nn.DataParallel); its record names the runtime class under training/strategies/.

Adding a method: its record here (in METHODS), and its equivalence, resume and bad-input tests. Adding an engine:
its record here, its runtime class, and those tests (docs/development.md walks through both).

The records sit below the schema, which validates strategy names with config.split, which reads them: their
functions take a run's RunSpec (`spec`) and TrainConfig (`train`) without importing the type."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from gpt2dist.config.units import FP32, gradient_bytes, ring_all_reduce, ring_gather
from gpt2dist.errors import UsageError

BAI, PATWARDHAN = "Bai 2022", "Patwardhan et al. 2024"
DDP_BUCKET_BYTES = 25 * 2**20  # DistributedDataParallel's bucket_cap_mb default
# Horovod's fusion buffer (HOROVOD_FUSION_THRESHOLD): 0.28's horovod/common/operations.cc sets 128 MiB by default,
# though its tensor-fusion docs still say 64 MB
HOROVOD_FUSION_BYTES = 128 * 2**20
# How the data-parallel ranks hold parameters, gradients and optimizer state: whole on every rank; sharded over all
# of them; sharded within groups of train.data_parallel_shard_size and replicated across the groups (HSDP)
REPLICATE, SHARD, HYBRID = "replicate", "shard", "hybrid"
# Backward's share of a step's FLOPs: 4 of every 6 per parameter and token (forward 2)
BACKWARD_SHARE = 2 / 3
NONE = "none"  # the method of a split without data parallelism: one replica split over every process


@dataclass(frozen=True)
class Part:
    """What a rank's data-parallel collectives move: its local parameter elements (its stage's, its tensor-parallel
    slice of them), the blocks it holds (FSDP gathers and reduces block by block) and the root's share of the
    parameters (the embeddings and ln_f, whose gradients are complete only when backward ends)."""

    elements: int
    blocks: int
    root_share: float
    gathered_bytes_per_element: int  # FSDP2's all-gathers: 16 bits under train.fsdp_mixed_precision, else fp32


@dataclass(frozen=True)
class Overlap:
    """The part of a step's traffic a strategy sends while its GPUs compute, and how much of the step's computation
    can cover it (a share of it): on GPUs, communication beyond that cover is what the step waits for."""

    bytes_per_step: float
    under: float


NO_OVERLAP = Overlap(0.0, 0.0)


@dataclass(frozen=True)
class Option:
    """A train.* switch of some methods alone: when it applies, and the precisions it needs (empty: any)."""

    when: str
    precisions: tuple[str, ...] = ()


# -- engines ----------------------------------------------------------------------------------------------------

def _one_process_one_device(spec, visible_gpus: int) -> None:
    if spec.nproc != 1:
        raise UsageError(f"strategy 'single' runs one process; got --nproc {spec.nproc} (use ddp, fsdp or horovod)")


def _data_parallel_devices(spec, visible_gpus: int) -> None:
    limit = max(visible_gpus, 1)
    if spec.nproc > limit:
        raise UsageError(f"strategy 'dp' drives one device per --nproc; {spec.nproc} requested but "
                         f"{visible_gpus} CUDA GPUs are visible (use --nproc {limit})")
    if spec.precision == "apex-O2":
        # O2 patches forward on the model object; DataParallel's replicas copy that bound method and so all run
        # the cuda:0 model.
        raise UsageError("precision 'apex-O2' patches the model's forward, which DataParallel replicas would "
                         "share with cuda:0; use dp with apex-O1, or ddp with apex-O2")


def _apex_on_cuda(spec, visible_gpus: int) -> None:
    if spec.device != "cuda":
        raise UsageError("strategy 'apex-ddp' (apex.parallel.DistributedDataParallel) needs CUDA GPUs; on CPU use ddp")
    if spec.precision in ("fp16", "bf16"):
        raise UsageError(f"strategy 'apex-ddp' pairs with Apex amp (apex-O1, apex-O2) or fp32, not torch.amp's "
                         f"{spec.precision}; use ddp for {spec.precision}")


def _scatter_and_gather(spec, degrees, part: Part) -> tuple[float, str, str, float]:
    """DataParallel's traffic: parameters broadcast from GPU 0 and gradients reduced to it at every micro-step,
    copies coalesced as DDP's buckets are, each a hop; without CUDA it runs on one device and sends nothing."""
    calls = 2 * degrees.grad_accum_steps * math.ceil(part.elements * FP32 / DDP_BUCKET_BYTES)
    if spec.device != "cuda":
        return 0.0, "none: DataParallel without CUDA runs on one device", "send", calls
    sent = 2 * (spec.nproc - 1) * part.elements * FP32 * degrees.grad_accum_steps
    return sent, "parameters broadcast from and gradients reduced to GPU 0, every micro-step", "send", calls


@dataclass(frozen=True)
class Engine:
    """The code that runs a method: its runtime class, how it starts its processes, what it needs, and where its
    traffic or memory differs from what the method's settings alone say."""

    name: str
    runtime: str  # "module:Class" under gpt2dist.training.strategies
    what: str  # what it runs, for `gpt2dist strategies`
    launcher: str = "torchrun"  # "python": one process drives every device of the run
    devices_per_process: str = "one"  # "all": nn.DataParallel's one process scatters over every device
    cuda_only: bool = False
    extras: tuple[str, ...] = ()  # keys of config.extras.EXTRAS
    gathers: bool = False  # FSDP2 under it: parameters gathered block by block, whatever the method
    bucket_bytes: int = DDP_BUCKET_BYTES  # gradients per all-reduce call
    buffer_bytes: int = 0  # device memory its communication takes beyond the model state
    no_overlap_under: tuple[str, ...] = ()  # precisions under which it reduces every gradient after backward
    refuse: Callable[..., None] | None = None  # what it cannot run, naming the key and what is allowed
    collectives: Callable[..., tuple[float, str, str, float]] | None = None  # its own, where not a ring's


SINGLE_ENGINE = Engine("plain", "single:Single", "the model unwrapped", launcher="python",
                       refuse=_one_process_one_device)
DATA_PARALLEL_ENGINE = Engine("nn.DataParallel", "dp:DataParallel", "torch.nn.DataParallel", launcher="python",
                              devices_per_process="all", refuse=_data_parallel_devices,
                              collectives=_scatter_and_gather)
TORCH_DDP = Engine("DistributedDataParallel", "ddp:DDP", "torch.nn.parallel.DistributedDataParallel")
HOROVOD_ENGINE = Engine("Horovod", "horovod:Horovod", "hvd.DistributedOptimizer", launcher="horovodrun",
                        extras=("horovod.torch",), bucket_bytes=HOROVOD_FUSION_BYTES,
                        buffer_bytes=HOROVOD_FUSION_BYTES,
                        # the model's cast to fp16 replaces the gradients Horovod hooked: reduced after backward
                        no_overlap_under=("apex-O2",))
APEX_ENGINE = Engine("Apex DDP", "apex_ddp:ApexDDP", "apex.parallel.DistributedDataParallel", cuda_only=True,
                     extras=("apex.parallel",), refuse=_apex_on_cuda)
TORCH_PATH = Engine("torch", "torch_distributed:TorchDistributed", "FSDP2 (fully_shard)", gathers=True)


# -- methods ----------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Method:
    """How the data-parallel ranks hold the state and how their gradients meet, with the engine that runs it and
    everything said of it."""

    name: str
    engine: Engine  # what runs it as a strategy of its own name
    summary: str  # one line as a named strategy
    listed: int | None  # where it sorts among the named strategies in every table and figure; None: not named
    papers: Mapping[str, str] = field(default_factory=dict)  # paper -> what it calls this strategy
    state: str = REPLICATE
    reshard_after_forward: bool = True  # sharded: gather the parameters again in backward (else keep forward's)
    reduce_every_micro_step: bool = False  # sharded: reduce-scatter after every micro-step (no whole gradients)
    optimizer_sharded: bool = False  # replicated: AdamW's state partitioned over the ranks (ZeRO-1)
    data_parallel: bool = True  # each rank computes the gradient of its own share of the batch
    in_a_split: str = ""  # its words as the method of a split (ddp-tp2); "": it takes no degree
    no_degrees: str = ""  # why it takes no degree: the error a name such as zero1-tp2 gets
    split_engine: Engine | None = None  # what runs it inside a split, where that is another engine
    accepts_apex: bool = True  # Apex amp can patch its model and optimizer
    options: Mapping[str, Option] = field(default_factory=dict)  # train.* switches of this method alone

    @property
    def shards_state(self) -> bool:
        """Parameters, gradients and optimizer state sharded over the data-parallel ranks."""
        return self.state != REPLICATE

    @property
    def composes(self) -> bool:
        return bool(self.in_a_split)

    def split(self, dp: int, train) -> dict:
        """The data-parallel degrees of `dp` ranks (and, for DataParallel, the devices one process drives)."""
        if self.state == SHARD:
            return {"dp_shard": dp}
        if self.state == HYBRID:
            shard = train.data_parallel_shard_size
            return {"dp_replicate": dp // shard, "dp_shard": shard,
                    "fixed_by": ("train.data_parallel_shard_size", shard)}
        if self.engine.devices_per_process == "all":
            return {"dp_replicate": dp, "devices_per_process": dp}  # one process reads and scatters every share
        return {"dp_replicate": dp}

    def check(self, spec, visible_gpus: int) -> None:
        """Refuse what this method cannot run with the precision and device, naming the key and what is allowed."""
        if self.engine.refuse:
            self.engine.refuse(spec, visible_gpus)
        for option, said in self.options.items():
            if said.precisions and getattr(spec.train, option) and spec.precision not in said.precisions:
                raise UsageError(f"train.{option} applies to --strategy {spec.strategy} {said.when}, not "
                                 f"{spec.strategy} with {spec.precision}; set train.{option}=false")

    def held(self, shape: tuple[int, ...], ranks: int) -> tuple[int, ...]:
        """Rank 0's part of a local parameter sharded over `ranks` (dp_shard): torch.chunk's first piece along dim 0,
        as FSDP2's Shard(0) cuts it, the largest; the whole of it unless the method shards."""
        if not self.shards_state:
            return shape
        return (-(-shape[0] // ranks), *shape[1:])

    # -- the data-parallel group's traffic, from the settings --------------------------------------------------
    def collectives(self, spec, degrees, part: Part) -> tuple[float, str, str, float]:
        """Bytes rank 0 sends per step over the data-parallel group, what they are, NCCL's kind of collective and
        how many calls (each paying a latency)."""
        if not self.data_parallel:
            return 0.0, "", "all-reduce", 0.0
        if self.engine.collectives:
            return self.engine.collectives(spec, degrees, part)
        if not self.shards_state:
            return self._replicated(spec, degrees, part)
        return self._sharded(spec, degrees, part)

    def _replicated(self, spec, degrees, part: Part) -> tuple[float, str, str, float]:
        """The gradients all-reduced once per step in the engine's buckets; under ZeRO-1 each rank's updated
        parameters then broadcast from it."""
        n, reduced = degrees.dp, part.elements * gradient_bytes(spec.precision)
        sent, calls = ring_all_reduce(reduced, n), math.ceil(reduced / self.engine.bucket_bytes)
        if not self.optimizer_sharded:
            return sent, "gradient all-reduce, once per step", "all-reduce", calls
        return (sent + ring_gather(part.elements * FP32, n),
                "gradient all-reduce, then each rank's updated parameters broadcast, once per step", "all-reduce",
                calls + n)

    def _sharded(self, spec, degrees, part: Part) -> tuple[float, str, str, float]:
        """Parameters all-gathered per block in forward (and again in backward unless kept), gradients
        reduce-scattered once per step (or per micro-step), and under HSDP each shard all-reduced across the
        groups. A pipeline's stage keeps its blocks gathered through its micro-batches (torchtitan's FSDP under a
        pipeline): one gather and one reduction per step."""
        n, micro = degrees.dp_shard, 1 if degrees.pp > 1 else degrees.passes
        gathers = micro * (2 if self.reshard_after_forward and degrees.pp == 1 else 1)
        scatters = micro if self.reduce_every_micro_step else 1
        sent = (gathers * ring_gather(part.elements * part.gathered_bytes_per_element, n)
                + scatters * ring_gather(part.elements * FP32, n))
        per_block = gathers + scatters
        again = "in forward and backward" if self.reshard_after_forward else "in forward"
        scattered = "per micro-step" if self.reduce_every_micro_step else "once per step"
        what = f"parameter all-gather {again} per micro-step, gradient reduce-scatter {scattered}"
        if self.state == HYBRID:
            sent += ring_all_reduce(part.elements * FP32 / n, degrees.dp_replicate)
            per_block += 1
            what = (f"parameter all-gather within the shard group {again} per micro-step; gradient reduce-scatter "
                    f"within it and all-reduce of each shard across the groups {scattered}")
        return sent, what, "all-gather", per_block * (part.blocks + 1)

    def overlap(self, spec, degrees, part: Part) -> Overlap:
        """What hides under computation. Replicated: the all-reduce runs bucket by bucket as backward produces them
        under the last pass's backward (the others skip it), all but the embeddings' bucket. Sharded: each block's
        all-gather is prefetched while the block before it computes and its reduce-scatter runs while the next
        computes backward, through the whole step, all but the root's. A pipeline's stages reduce after their last
        micro-batch, exposed."""
        if (not self.data_parallel or self.engine.collectives or degrees.pp > 1
                or spec.precision in self.engine.no_overlap_under):
            return NO_OVERLAP
        if self.shards_state:
            return Overlap(self.collectives(spec, degrees, part)[0] * (1 - part.root_share), 1.0)
        reduced = ring_all_reduce(part.elements * gradient_bytes(spec.precision) * (1 - part.root_share), degrees.dp)
        return Overlap(reduced, BACKWARD_SHARE / degrees.passes)


FSDP_MIXED_PRECISION = {"fsdp_mixed_precision": Option("with --precision bf16 or fp16", ("bf16", "fp16"))}
ONE_RANK_OF_ALL = "all-reduces whole gradients over all of its ranks; use ddp"

METHODS: Mapping[str, Method] = MappingProxyType({method.name: method for method in (
    Method("single", SINGLE_ENGINE, "one process on one device: the reference every strategy must match", 0,
           {BAI: "Single GPU", PATWARDHAN: "single GPU"}, data_parallel=False,
           no_degrees="single is one process on one device; use ddp, or no method (tp2-pp2) for one split replica",
           # train.cuda_graphs needs compile_whole_model (the schema's check): single's too
           options={"compile_whole_model": Option("(the one process that holds the whole model, unwrapped)")}),
    Method("dp", DATA_PARALLEL_ENGINE, "torch.nn.DataParallel: one process scatters each batch over --nproc GPUs", 1,
           {BAI: "Single Parameter Server"},
           no_degrees="torch.nn.DataParallel runs in one process, which cannot hold a rank's slice; use ddp"),
    Method("ddp", TORCH_DDP, "DistributedDataParallel: one process per device, bucketed all-reduce overlapped with "
           "backward", 2, {BAI: "Distributed Parameter Server", PATWARDHAN: "DDP"},
           in_a_split="replicas with all-reduced gradients (DDP)",
           # torch's DDP composes with neither DTensor parameters nor a pipeline stage's reducer (ddp.py says how it
           # failed); FSDP2 over a replicate-only mesh holds the same replicated state and averages the same way
           split_engine=TORCH_PATH),
    Method("horovod", HOROVOD_ENGINE, "Horovod's DistributedOptimizer: ring all-reduce, launched by horovodrun", 3,
           {BAI: "Horovod"}, no_degrees=f"Horovod {ONE_RANK_OF_ALL}"),
    Method("fsdp", TORCH_PATH, "FSDP2 (fully_shard): parameters, gradients and optimizer state sharded over ranks", 4,
           {PATWARDHAN: "FSDP"}, state=SHARD, in_a_split="FSDP2 over replicas", accepts_apex=False,
           options=FSDP_MIXED_PRECISION),
    Method("apex-ddp", APEX_ENGINE, "apex.parallel.DistributedDataParallel (CUDA): Bai 2022's DDP + Apex wrapper", 8,
           {BAI: "Distributed Parameter Server + Apex"},
           no_degrees=f"apex.parallel.DistributedDataParallel {ONE_RANK_OF_ALL}"),
    Method("zero1", TORCH_DDP, "ZeRO-1: DDP's all-reduce, AdamW's state partitioned over ranks "
           "(ZeroRedundancyOptimizer)", 9, optimizer_sharded=True, accepts_apex=False,
           no_degrees="torch's ZeroRedundancyOptimizer partitions whole parameters over one process group and gathers "
                      "its state on rank 0, neither of which a tensor-parallel slice or a pipeline stage is; use zero2 "
                      "(ZeRO-2 on FSDP2), which shards the optimizer state too"),
    Method("hsdp", TORCH_PATH, "HSDP: FSDP2 sharding in groups of train.data_parallel_shard_size ranks, replicated "
           "across them", 11, state=HYBRID, in_a_split="HSDP over replicas", accepts_apex=False,
           options=FSDP_MIXED_PRECISION),
    Method("zero2", TORCH_PATH, "ZeRO-2 on FSDP2: parameters gathered once per forward, gradients and optimizer state "
           "sharded", 10, state=SHARD, reshard_after_forward=False, reduce_every_micro_step=True,
           in_a_split="ZeRO-2 over replicas", accepts_apex=False, options=FSDP_MIXED_PRECISION),
    Method(NONE, TORCH_PATH, "no data parallelism: one replica split over every process", None, data_parallel=False,
           in_a_split="one replica"),
)})
# Every engine a method runs on, as a strategy of its own name or inside a split
ENGINES: tuple[Engine, ...] = tuple(dict.fromkeys(
    engine for method in METHODS.values() for engine in (method.engine, method.split_engine) if engine))
