"""Every strategy described once, without torch: a split of the devices (config.split: a data-parallel method and
tensor- and pipeline-parallel degrees) with its method's record (config.methods). Here: what a name says (its words,
its engine, how it is launched, its degrees for a process count, the extras it needs) and the combinations any
run of it refuses. Config, planning, preflight, doctor, selftest, findings and the CLI ask this registry; the
parameters a rank holds are config.geometry's, the bytes it sends config.traffic's, its memory config.memory's.

The twelve named strategies are points of the same grammar (`tp` is one replica split by layer over every
process, `fsdp-tp` FSDP over tensor-parallel groups of train.tensor_parallel_size ranks)."""

from __future__ import annotations

import functools
from dataclasses import dataclass

from gpt2dist.config.degrees import Degrees
from gpt2dist.config.extras import EXTRAS, PRECISION_EXTRAS, Extra
from gpt2dist.config.methods import METHODS, Engine, Method, Option
from gpt2dist.config.schema import INTERLEAVED_SCHEDULES, RunSpec, TrainConfig
from gpt2dist.config.split import NAMED, TENSOR_PARALLEL_SETTING, Split, parse_split
from gpt2dist.config.units import APEX_PRECISIONS
from gpt2dist.errors import UsageError


@dataclass(frozen=True)
class Description:
    """A strategy: its split (the name parsed) and its data-parallel method, composed."""

    split: Split
    method: Method

    @property
    def name(self) -> str:
        return self.split.name

    @property
    def summary(self) -> str:
        """One line for `gpt2dist strategies` and `train --help`."""
        if self.split.named:
            return self.split.summary
        parts = [f"{kind} {degree}" for kind, degree in (("tensor parallel", self.split.tp),
                                                         ("pipeline parallel", self.split.pp)) if degree != 1]
        each = "" if not self.method.data_parallel else ", each"
        return f"{self.method.in_a_split}{each} split {' x '.join(parts)}"

    @property
    def papers(self) -> dict[str, str]:
        """Paper -> what it calls this strategy."""
        return self.split.papers if self.split.named else {}

    @property
    def engine(self) -> Engine:
        """What runs it: the method's engine, or the one that runs the method inside a split (ddp's: FSDP2)."""
        return (self.method.split_engine or self.method.engine) if self.splits_model else self.method.engine

    @property
    def engine_words(self) -> str:
        """What runs it, for `gpt2dist strategies`: the data-parallel wrapper (as the method's settings make it),
        then tensor and pipeline parallelism's."""
        method, parts = self.method, []
        if method.data_parallel:
            if self.engine.gathers:
                mesh = {"replicate": " over a replicate-only mesh (a shard group of 1)",
                        "shard": "", "hybrid": " on a replicate x shard mesh"}[method.state]
                kept = "" if method.reshard_after_forward else ", reshard_after_forward=False"
                parts.append(f"{self.engine.what}{mesh}{kept}")
            else:
                parts.append(self.engine.what + (" + ZeroRedundancyOptimizer" if method.optimizer_sharded else ""))
        if self.split.tp != 1:
            parts.append("DTensor tensor parallel")
        if self.split.pp != 1:
            parts.append("torch.distributed.pipelining")
        return " + ".join(parts) or "the model unwrapped, one device"

    @property
    def launcher(self) -> str:
        return self.engine.launcher

    @property
    def one_process(self) -> bool:
        return self.launcher == "python"

    @property
    def data_parallel(self) -> bool:
        """Whole-model copies (replicated or sharded), each rank on its share of the batch."""
        return self.method.data_parallel and not self.split.splits_model

    @property
    def splits_model(self) -> bool:
        """The model itself is divided over processes (each group of them: one replica)."""
        return self.split.splits_model

    @property
    def shards_state(self) -> bool:
        return self.method.shards_state

    @property
    def idle_by_design(self) -> bool:
        """Ranks wait for each other by design (a pipeline's bubble)."""
        return self.split.pp != 1

    @property
    def cuda_only(self) -> bool:
        return self.engine.cuda_only

    @property
    def accepts_apex(self) -> bool:
        """Apex amp can patch its model and optimizer: not a split model's."""
        return self.method.accepts_apex and not self.splits_model

    @property
    def extras(self) -> tuple[str, ...]:
        return self.engine.extras

    @property
    def options(self) -> dict[str, Option]:
        """train.* switches of this strategy alone -> when they apply (the method's, on an unsplit model)."""
        return {} if self.splits_model else dict(self.method.options)

    def degrees(self, nproc: int, train: TrainConfig) -> Degrees:
        """How this strategy divides nproc devices and the global batch (config.degrees checks them)."""
        tp, pp = self.split.degrees(nproc, train.tensor_parallel_size)
        dp = max(1, nproc // (tp * pp))
        extra = {}
        if self.split.tp == TENSOR_PARALLEL_SETTING:  # fsdp-tp's degree
            extra["fixed_by"] = (TENSOR_PARALLEL_SETTING, tp)
        virtual = train.pipeline_virtual_stages if pp > 1 and train.pipeline_schedule in INTERLEAVED_SCHEDULES else 1
        return Degrees(self.name, nproc, train.global_batch_size, train.micro_batch_size,
                       **{**self.method.split(dp, train), **extra}, tp=tp, pp=pp, pp_virtual=virtual,
                       composed=not self.split.named, method=self.method.name)

    def check(self, spec: RunSpec, visible_gpus: int) -> None:
        """Refuse what this strategy cannot run with the precision and device, naming the key and what is allowed
        (Degrees.validate refuses what does not divide)."""
        self.method.check(spec, visible_gpus)
        degrees = degrees_of(spec)
        if degrees.pp > 1 and spec.precision == "fp16":
            raise UsageError(f"strategy '{self.name}' runs backward inside the pipeline schedule, where fp16's loss "
                             f"scaler cannot wrap it; use {self.name} with bf16")
        if degrees.tp > 1 and spec.precision == "fp16" and spec.device == "cuda":
            # seen on an H100 (torch 2.11): aten._amp_foreach_non_finite_check_and_unscale_ got mixed Tensor and DTensor
            raise UsageError(f"strategy '{self.name}' with fp16 on CUDA: the loss scaler checks all gradients in "
                             "one fused kernel, which refuses tensor parallelism's mix of DTensor and plain gradients; "
                             f"use {self.name} with bf16")


@functools.cache
def describe(name: str) -> Description:
    """The strategy a name says: one of the twelve, or a method with degrees (config.split)."""
    split = parse_split(name)
    return Description(split, METHODS[split.method])


# in config.split's NAMED order, the order of every table and figure
STRATEGIES: dict[str, Description] = {name: describe(name) for name in NAMED}
REFERENCE = "single"  # the strategy every other one must follow


def degrees_of(spec: RunSpec) -> Degrees:
    """The run's degrees (checked by check_run before a run starts)."""
    return describe(spec.strategy).degrees(spec.nproc, spec.train)


def called(paper: str, their_name: str) -> str:
    """Our strategy for what `paper` calls `their_name` (the papers' claims are stated in their words)."""
    return next(name for name, d in STRATEGIES.items() if d.papers.get(paper) == their_name)


def extras_needed(strategy: str, precision: str) -> list[Extra]:
    return [EXTRAS[key] for key in (*describe(strategy).extras, *PRECISION_EXTRAS.get(precision, ()))]


def check_tensor_parallel_inside_nodes(spec: RunSpec, nodes: int) -> None:
    """A tensor-parallel group is consecutive ranks: refuse one that `nodes` nodes would split, naming the fix."""
    tp, per_node = degrees_of(spec).tp, spec.nproc // nodes
    if tp > 1 and per_node % tp:
        raise UsageError(f"strategy '{spec.strategy}' splits every layer over {tp} consecutive ranks, and with "
                         f"{per_node} processes on each of {nodes} nodes a tensor-parallel group would span nodes "
                         "(four all-reduces per block and micro-batch on the link between them); use a "
                         f"tensor-parallel degree that divides {per_node}, or {tp} processes or more per node")


def check_run(spec: RunSpec, visible_gpus: int) -> None:
    """Refuse a combination that cannot run, naming the key and what is allowed."""
    description = describe(spec.strategy)
    description.check(spec, visible_gpus)
    for option, said in {option: said for d in STRATEGIES.values() for option, said in d.options.items()}.items():
        if option not in description.options and getattr(spec.train, option):
            owners = [name for name, d in STRATEGIES.items() if option in d.options]
            names = owners[0] if len(owners) == 1 else f"{', '.join(owners[:-1])} or {owners[-1]}"
            raise UsageError(f"train.{option} applies to --strategy {names} {said.when}, not {spec.strategy} with "
                             f"{spec.precision}; set train.{option}=false")
    if spec.train.cuda_graphs and spec.device != "cuda":
        raise UsageError("train.cuda_graphs replays the step as CUDA graphs, which need a CUDA GPU; on CPU set "
                         "train.cuda_graphs=false")
    if spec.precision in APEX_PRECISIONS:
        if not description.accepts_apex:
            raise UsageError(f"precision 'apex-*' cannot wrap {spec.strategy}'s sharded or split parameters or "
                             f"optimizer state; use {spec.strategy} with bf16 or fp16")
        if spec.device != "cuda":
            raise UsageError(f"precision '{spec.precision}' needs CUDA; on CPU use bf16 or fp16 (torch.amp)")
    check_placement(spec, visible_gpus)
    degrees_of(spec).validate_schedule(spec.train)
    if spec.nodes > 1:
        check_tensor_parallel_inside_nodes(spec, spec.nodes)


def check_placement(spec: RunSpec, visible_gpus: int) -> None:
    """Refuse degrees that do not divide the model, the batch or the cluster: what any run of the split needs,
    whatever this engine's runtime can run of it (check_run refuses that too: fewer micro-batches than stages, a
    tensor-parallel group across nodes). The planner holds published runs of other frameworks to this alone."""
    description, degrees = describe(spec.strategy), degrees_of(spec)
    degrees.validate(spec.model, spec.train)
    if spec.nodes > 1:
        if description.one_process:
            raise UsageError(f"strategy '{spec.strategy}' runs in one process, which cannot spread over {spec.nodes} "
                             f"nodes; use one of {', '.join(n for n, d in STRATEGIES.items() if not d.one_process)}")
        if spec.nproc % spec.nodes:
            raise UsageError(f"--nproc {spec.nproc} does not divide over {spec.nodes} nodes; give each node as many "
                             f"processes (e.g. --nproc {spec.nodes * max(1, spec.nproc // spec.nodes)})")
    per_node = spec.nproc // spec.nodes
    if spec.device == "cuda" and per_node > visible_gpus:
        where = f" on each of {spec.nodes} nodes" if spec.nodes > 1 else ""
        raise UsageError(f"--nproc {spec.nproc} needs {per_node} CUDA GPUs{where}, but this node sees {visible_gpus}")

