"""The typed schema of params.yaml and of one resolved run (RunSpec), with the one-line messages that bad
values get. A RunSpec is resolved once, in the launching process, and handed to every rank as JSON, so every
rank and every launcher sees the same values and bad input fails before any process group exists."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, WithJsonSchema, model_validator

from gpt2dist.config.split import EXAMPLES, NAME_PATTERN, NAMED, parse_split
from gpt2dist.errors import UsageError
from gpt2dist.io import atomic_write_text

# torch.distributed's rendezvous port: launchers pass it, and ranks that SLURM starts derive theirs from it.
DEFAULT_PORT = 29500


def _split_name(name: str) -> str:
    try:
        parse_split(name, said="strategy")
    except UsageError as exc:
        raise ValueError(str(exc)) from None
    return name


# A named strategy or a data-parallel method with degrees (config.split); config.strategies describes each
StrategyName = Annotated[str, AfterValidator(_split_name), WithJsonSchema(
    {"type": "string", "pattern": f"^{NAME_PATTERN}$",
     "description": f"One of {', '.join(NAMED)}, or a data-parallel method with degrees such as {EXAMPLES}."})]
# The named strategies, in the order of every table and figure
STRATEGY_NAMES: tuple[str, ...] = tuple(NAMED)
# fp32 is IEEE fp32 everywhere; tf32 is fp32 with TF32 tensor-core matmuls (NVIDIA containers' default).
PrecisionName = Literal["fp32", "tf32", "fp16", "bf16", "apex-O1", "apex-O2"]
DeviceType = Literal["cpu", "cuda"]
PRECISIONS: tuple[str, ...] = get_args(PrecisionName)
# torch's pipeline schedules that a pp run may take (training.strategies.pipeline_parallel runs each); the
# interleaved ones hold several stages per rank (train.pipeline_virtual_stages)
PipelineSchedule = Literal["gpipe", "1f1b", "interleaved-1f1b", "zero-bubble"]
PIPELINE_SCHEDULES: tuple[str, ...] = get_args(PipelineSchedule)
INTERLEAVED_SCHEDULES = ("interleaved-1f1b", "zero-bubble")
# the one that runs every forward before any backward; the others start backward once each rank holds a micro-batch
ALL_FORWARDS_FIRST = "gpipe"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelConfig(_Strict):
    """GPT-2 architecture (transformers' GPT2Config names)."""

    # Bounds far above any GPT-2 (XL: 48 blocks) that keep a typo from planning for minutes: each block's
    # tensors are counted one by one
    n_layer: int = Field(gt=0, le=1024, description="Transformer blocks.")
    n_head: int = Field(gt=0, description="Attention heads per block; must divide n_embd.")
    n_embd: int = Field(gt=0, description="Residual stream width.")
    n_positions: int = Field(gt=0, description="Context length trained on (tokens per sequence).")
    vocab_size: int = Field(gt=0, description="Embedding rows; must be >= the data's vocabulary.")
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description="Residual, embedding and attention dropout.")

    @model_validator(mode="after")
    def _heads_divide_width(self) -> ModelConfig:
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")
        return self


class ModelShape(_Strict):
    """A model size by the three numbers GPT-2's sizes differ in; context and vocabulary stay the preset's."""

    n_layer: int = Field(gt=0, le=1024)
    n_head: int = Field(gt=0)
    n_embd: int = Field(gt=0)


# A size's name stands in configuration ids (ddp-bf16-n8-medium-r0): lower-case letters and digits, a letter first
SIZE_NAME = r"^[a-z][a-z0-9]*$"


class TrainConfig(_Strict):
    """Optimisation and bookkeeping. The global batch is what makes strategies comparable."""

    global_batch_size: int = Field(gt=0, description="Sequences per optimizer step, for every strategy.")
    micro_batch_size: int = Field(gt=0, description="Sequences per forward pass per device.")
    max_steps: int = Field(gt=0, description="Optimizer steps.")
    lr: float = Field(gt=0, description="Peak learning rate (AdamW).")
    min_lr: float = Field(ge=0, description="Learning rate at the end of the cosine decay.")
    lr_warmup_steps: int = Field(0, ge=0, description="Steps of linear learning-rate warm-up before the cosine decay.")
    weight_decay: float = Field(0.1, ge=0)
    beta1: float = Field(0.9, gt=0, lt=1)
    beta2: float = Field(0.95, gt=0, lt=1)
    grad_clip: float = Field(1.0, ge=0, description="Max global grad norm; 0 disables clipping.")
    eval_interval: int = Field(gt=0, description="Evaluate on the validation split every this many steps.")
    eval_batches: int = Field(gt=0, description="Global batches per evaluation.")
    checkpoint_interval: int = Field(gt=0, description="Write a resumable checkpoint every this many steps.")
    checkpoint_minutes: float = Field(0, ge=0, description="Also write one when this many minutes passed since the "
                                      "last (0: steps only), so a job stopped at a cluster's time limit loses at most "
                                      "that much whatever its speed.")
    compile: bool = Field(False, description="torch.compile each transformer block.")
    compile_whole_model: bool = Field(False, description="single only, with compile: compile the whole forward, "
                                      "the model and its head loss, as one graph instead of block by block: fewer "
                                      "kernels and launch gaps on a GPU (GPT-2 small ran about 1,000 kernels per "
                                      "micro-batch on an H200 and sat idle between them for 12% of a step). The "
                                      "other strategies wrap or split the model and compile its blocks.")
    cuda_graphs: bool = Field(False, description="single with compile_whole_model, on a CUDA GPU: the compiled "
                              "forward and backward captured once as CUDA graphs and replayed every micro-batch "
                              "(torch.compile's reduce-overhead mode), one launch for all of a graph's kernels "
                              "instead of one each; their memory is a pool of their own. Refused on CPU, which "
                              "has no graphs to replay.")
    head_loss_chunk_tokens: int = Field(0, ge=0, description="Compute the head's logits and their cross-entropy "
                                        "this many tokens at a time, gradients included, so that a micro-batch's "
                                        "full logits never exist (at GPT-2's vocabulary 65 times its hidden states); "
                                        "0: all at once.")
    ledger_steps: int = Field(2, ge=0, description="The run's last steps traced with torch.profiler for the time "
                              "ledger (compute, hidden and exposed communication, data, idle); they are left out of "
                              "throughput statistics. 0: no ledger.")
    fsdp_mixed_precision: bool = Field(
        False,
        description="fsdp with bf16 or fp16 only: FSDP2's MixedPrecisionPolicy, parameters all-gathered and "
                    "computed in that dtype, gradients reduced in fp32. Off (default): fp32 communication, as DDP.",
    )
    tensor_parallel_size: int = Field(2, gt=1, description="The named strategy fsdp-tp only: processes that split "
                                      "each layer (tensor parallel); FSDP shards over nproc / tensor_parallel_size "
                                      "replicas. Other splits say their degrees in their name (fsdp-tp4, ddp-tp2-pp2).")
    data_parallel_shard_size: int = Field(2, gt=0, description="hsdp and its splits (hsdp-tp2, ...): data-parallel "
                                          "ranks that shard one copy of the model state; it is replicated over the "
                                          "data-parallel ranks / data_parallel_shard_size groups.")
    activation_checkpointing: Literal["none", "block"] = Field(
        "none", description="Every strategy: 'block' keeps only each transformer block's input for backward and "
        "computes the rest again there (about a third more compute for a block's activations in memory).")
    pipeline_schedule: PipelineSchedule = Field(
        "1f1b", description="Every split with a pipeline (pp, ddp-pp2, tp2-pp2, ...): GPipe (all forwards, then all "
        "backwards), 1F1B (one forward, one backward, fewer activations held), interleaved 1F1B "
        "(pipeline_virtual_stages stages per rank: a bubble that many times smaller) or interleaved zero-bubble (ZB1P: "
        "each backward split into its input and weight gradients, the weight ones filling the bubble). Each "
        "data-parallel share of the global batch is one pipeline step of micro-batches of micro_batch_size.")
    pipeline_virtual_stages: int = Field(2, ge=2, description="A pipeline with interleaved-1f1b or zero-bubble: stages "
                                         "per rank; pipeline rank r of p holds stages r, r + p, r + 2p, ...")
    seed: int = Field(1337, ge=0, description="Seeds init, data order and dropout.")

    @model_validator(mode="after")
    def _lr_order(self) -> TrainConfig:
        if self.min_lr > self.lr:
            raise ValueError(f"min_lr ({self.min_lr}) must not exceed lr ({self.lr})")
        if self.compile_whole_model and not self.compile:
            raise ValueError("compile_whole_model says how to compile (the whole model at once), not whether; set "
                             "compile=true too")
        if self.cuda_graphs and not self.compile_whole_model:
            raise ValueError("cuda_graphs replays the whole model's compiled graph; set compile=true and "
                             "compile_whole_model=true too")
        return self


class EmbeddedSource(_Strict):
    """Docstrings of this Python's standard library: a stand-in corpus for smoke runs, not a benchmark."""

    kind: Literal["embedded"]
    min_chars: int = Field(200, gt=0, description="Skip docstrings shorter than this.")


class FilesSource(_Strict):
    """Local .txt (one document per file), .jsonl (one per line) or .parquet (one per row) files."""

    kind: Literal["files"]
    paths: list[str] = Field(min_length=1, description="Glob patterns, relative to the working directory.")
    text_field: str = Field("text", description="Field (.jsonl) or column (.parquet) holding the text.")


class HFSource(_Strict):
    """A dataset loaded with datasets.load_dataset: a hub name with a pinned revision, or a local directory."""

    kind: Literal["hf"]
    name: str = Field(description="Hub dataset id, or a local dataset directory.")
    config: str | None = Field(None, description="Dataset configuration, e.g. wikitext-103-raw-v1.")
    revision: str | None = Field(None, description="Hub commit to pin (required for hub datasets).")
    text_column: str = "text"
    train_split: str = "train"
    val_split: str | None = Field("validation", description="None: carve val_fraction out of train.")


class TokenizerConfig(_Strict):
    kind: Literal["gpt2", "bpe"] = Field(description="gpt2: GPT-2's BPE; bpe: byte-level BPE trained on the corpus.")
    path: str | None = Field(None, description="gpt2: directory with encoder.json and vocab.bpe; None: the hub's gpt2.")
    vocab_size: int | None = Field(None, gt=256, le=65536, description="bpe: vocabulary size to train.")

    @model_validator(mode="after")
    def _vocab_for_bpe(self) -> TokenizerConfig:
        if self.kind == "bpe" and self.vocab_size is None:
            raise ValueError("a trained bpe tokenizer needs vocab_size (e.g. 4096)")
        if self.kind == "gpt2" and self.vocab_size is not None:
            raise ValueError("vocab_size is fixed (50257) for the gpt2 tokenizer; remove it")
        return self


class DataConfig(_Strict):
    source: EmbeddedSource | FilesSource | HFSource = Field(discriminator="kind")
    tokenizer: TokenizerConfig
    val_fraction: float = Field(0.05, gt=0, lt=0.5, description="Documents held out when the source has no val split.")
    seed: int = Field(1337, ge=0, description="Seeds the train/val assignment of documents.")
    batch_documents: int = Field(1024, gt=0, description="Documents per encode batch (bounds memory).")


class RunGroup(_Strict):
    """A cross product of runs: every strategy x precision x process count listed."""

    strategies: list[StrategyName] = Field(min_length=1)
    precisions: list[PrecisionName] = Field(min_length=1)
    nproc: list[int] = Field(min_length=1, description="Processes (GPUs on CUDA machines) per run.")
    label: str | None = Field(None, description="What a paper calls these runs (e.g. 'Horovod + Apex'), shown "
                              "beside the configuration in tables and figures.")
    nodes: int = Field(1, ge=1, description="Nodes the processes spread over, nproc / nodes on each: a cluster's "
                       "nodes (a SLURM allocation of that many; planned only where the study's `nodes` allows), or "
                       "with emulate, nodes emulated on this machine.")
    emulate: bool = Field(False, description="With nodes > 1: nodes emulated on this machine (network namespaces, "
                          "needs root; CPU only, the nodes share its cores) instead of a cluster's. Implied by link_mbit.")
    link_mbit: list[float] = Field([], description="Emulated nodes' link bandwidth, Mbit/s each way, one run per "
                                   "value (empty: unshaped); only emulated links can be shaped, so it implies emulate.")
    sizes: list[str] = Field([], description="Model sizes to train these runs at, one run per size: GPT-2's small, "
                             "medium, large and xl, or a name of study.model_sizes (empty: the preset's model). Each "
                             "size is ranked on its own.")

    @model_validator(mode="before")
    @classmethod
    def _shaped_links_are_emulated(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("link_mbit") and "emulate" not in data:
            return {**data, "emulate": True}
        return data
    repeats: int | None = Field(None, ge=1, le=1000, description="Repeats of these runs (null: study.repeats); fewer where a "
                                "run is costly, at the price of its interval.")

    @model_validator(mode="after")
    def _positive(self) -> RunGroup:
        if any(n < 1 for n in self.nproc):
            raise ValueError(f"nproc values must be >= 1, got {self.nproc}")
        if self.nodes > 1 and any(n % self.nodes for n in self.nproc):
            raise ValueError(f"nproc values must be multiples of nodes ({self.nodes}), got {self.nproc}")
        if self.emulate and self.nodes == 1:
            raise ValueError("emulate makes nodes on this machine; set nodes to 2 or more")
        if self.link_mbit and not self.emulate:
            raise ValueError("link_mbit shapes emulated nodes' links, and emulate is false; drop one of them")
        if any(rate <= 0 for rate in self.link_mbit):
            raise ValueError(f"link_mbit values must be positive, got {self.link_mbit}")
        return self


class AddedRepeats(_Strict):
    """Repeats the study adds after its planned ones, only to configurations whose place in the ranking is still
    undecided, one round at a time, until they are placed or the budget is spent (Snakemake; DVC trains the
    planned repeats only)."""

    rounds: int = Field(0, ge=0, le=100, description="At most this many added rounds (0: none).")
    max_runs: int = Field(0, ge=0, description="At most this many added runs in all, the top configuration's "
                          "partner runs included (0: no limit by count).")
    max_minutes: float = Field(0, ge=0, description="At most this much training time added in all, each run "
                               "counted at its configuration's mean so far (0: no limit by time).")
    max_study_minutes: float = Field(0, ge=0, description="At most this much run time for the whole study, its "
                                     "planned runs included: a round trains only what fits in what the finished "
                                     "runs (their measured job times) left of it (0: no limit; `gpt2dist tune` sets "
                                     "it from its budget).")
    resolve: float = Field(0.05, ge=0, lt=1, description="The smallest throughput gap worth runs to settle: a "
                           "configuration whose ratio to its placement's top may lie below 1 - resolve and may be "
                           "1 is undecided; one certainly within it counts as tied.")
    halving: bool = Field(True, description="A round repeats only the configurations still undecided, beside their "
                          "placement's top; those placed slower beyond the noise, or tied, are dropped. false: every "
                          "configuration of a placement with one undecided, every round (what halving saves).")

    @model_validator(mode="after")
    def _bounded(self) -> AddedRepeats:
        if self.rounds and not (self.max_runs or self.max_minutes or self.max_study_minutes):
            raise ValueError("added_repeats with rounds needs a budget: max_runs, max_minutes or max_study_minutes "
                             "above 0")
        return self


class StudyConfig(_Strict):
    """Which runs the pipeline trains and how their numbers are summarised."""

    needs_gpus: bool = Field(False, description="A study for GPU nodes: a host without GPUs plans it only where "
                             "gpus_per_node is given (0 plans it for CPUs on purpose), and `gpt2dist train` there "
                             "refuses rather than train it on the CPU.")
    repeats: int = Field(3, ge=1, le=1000, description="Repeats per configuration (3 or more give confidence "
                         "intervals; at most 1000, a run each).")
    excluded_steps: int = Field(5, ge=0, description="Leading steps of each run left out of throughput statistics "
                                "(compilation, allocator and cache warm-up).")
    keep_checkpoints: Literal["none", "fastest", "all"] = Field(
        "fastest", description="Which runs keep their final checkpoint (in kept/, declared as outputs: pushed and "
        "pulled with DVC, out of bundles unless asked for), for `gpt2dist export`: fastest, each configuration's "
        "first repeat, as which configuration is fastest is known only once all have run (summary.md names the top "
        "tier's to export); all, every run; none. A checkpoint holds the model and AdamW's state: about 11 MiB per "
        "run in the cpu preset, 1.5 GB at GPT-2 small.")
    selftests: bool = Field(True, description="Check each configuration with `gpt2dist selftest` (a tiny model, a "
                            "few steps) before its runs, so a node that cannot run it fails in minutes. false: the "
                            "runs are their own check, where they take no longer than a selftest.")
    time_at_start: bool = Field(True, description="Snakemake's start times the preset's model in one process "
                                "(gpt2dist estimate) for the study's expected duration, which each run's progress "
                                "line scales. false: that estimate is written before (gpt2dist tune writes its own, "
                                "by candidate).")
    train_runtime_min: int = Field(60, gt=0, description="Time limit of one train job on a cluster (SLURM "
                                   "--time), minutes; a job that hits it is retried and resumes from its checkpoint.")
    max_foreign_cpu_share: float = Field(0.1, ge=0, le=1, description="A run is disturbed when other processes "
                                         "used more than this share of its CPUs during its steady-state steps (mean of the load samples).")
    max_step_time_spread: float = Field(0.25, gt=0, description="A run is disturbed when its steady-state step times "
                                        "spread more than this (median absolute deviation / median).")
    max_repeat_deviation: float = Field(0.3, gt=0, description="A run is an outlier, fast or slow, when its "
                                        "throughput lies more than this share from the median of its configuration's "
                                        "other undisturbed runs (2 or more) and more than twice as far as they lie from "
                                        "each other; it is marked and left out of the statistics like a disturbed run.")
    min_cpu_share: float = Field(0.6, ge=0, le=1, description="On CPU, a run is disturbed when rank 0 got less than "
                                 "this share of its compute threads' time (median CPU time / (step time x threads)), "
                                 "of what the machine's cores let them have (4 ranks of a thread each on 2 cores: "
                                 "half). "
                                 "Waiting on communication counts as idle: undisturbed tp and fsdp ranks at 2 processes "
                                 "get 0.74-0.87; a starved one far less. Not applied to pp, whose stages idle by design, "
                                 "nor on emulated nodes' shaped links, where ranks wait for the link.")
    target_val_loss: float | None = Field(None, gt=0, description="Validation loss each run is timed to (time to "
                                          "target, beside throughput); null: 1% above the worst final validation "
                                          "loss of single's fp32 runs.")
    max_disturbed: int | None = Field(None, ge=0, description="collect refuses the study when more runs than this "
                                      "are disturbed, naming the command that re-runs them; null: mark them, leave "
                                      "them out of the statistics, and go on.")
    added_repeats: AddedRepeats = Field(default_factory=AddedRepeats)
    gpu_memory_gb: float | None = Field(None, gt=0, allow_inf_nan=False, description="Memory of the GPUs a study on GPUs is planned for, "
                                        "GB: configurations whose predicted peak (config.memory) does not fit are "
                                        "dropped, saying why; null: none is dropped for memory.")
    model_sizes: dict[str, ModelShape] = Field({}, description="Sizes besides GPT-2's four that runs' `sizes` may "
                                               "name, by depth, heads and width (the CPU presets' tiny ones).")
    runs: list[RunGroup] = Field(min_length=1)

    @model_validator(mode="after")
    def _size_names(self) -> StudyConfig:
        for name in self.model_sizes:
            if not re.match(SIZE_NAME, name):
                raise ValueError(f"model_sizes: '{name}' is no size name; use lower-case letters and digits, a "
                                 "letter first (it stands in run ids)")
        return self


class Preset(_Strict):
    data: DataConfig
    model: ModelConfig
    train: TrainConfig
    study: StudyConfig


class ExtendingPreset(_Strict):
    """A preset written as another one plus changes: its sections are laid over those of the preset it
    extends (mappings merge key by key; lists and values replace), then validated as a whole."""

    extends: str = Field(description="The preset this one starts from.")
    data: dict = Field({}, description="Changes to the data section.")
    model: dict = Field({}, description="Changes to the model section.")
    train: dict = Field({}, description="Changes to the train section.")
    study: dict = Field({}, description="Changes to the study section.")


class ParamsFile(_Strict):
    """The whole params.yaml; its JSON schema (workflow/schemas/) is generated from this."""

    preset: str = Field("auto", description="A preset name, or auto: paper with CUDA GPUs, cpu without.")
    gpus_per_node: int | None = Field(
        None, ge=0, description="GPUs per node the study is planned for; null: the GPUs visible where it is "
        "planned. Set it (or `snakemake --config gpus_per_node=8`) when planning on a login node without GPUs.")
    nodes: int = Field(1, ge=1, description="Nodes of the cluster a study may span: run groups with more nodes "
                       "are dropped with a warning naming them (`snakemake --config nodes=2` says it on the command "
                       "line).")
    container: str = Field(description="Image every pipeline rule runs in under --sdm apptainer.")
    presets: dict[str, Preset | ExtendingPreset] = Field(min_length=1)


# How a computation is spread over processes, not what it computes (RunSpec.computation_fingerprint)
PLACEMENT = ("strategy", "nproc")
PLACEMENT_TRAIN = ("tensor_parallel_size", "pipeline_schedule", "pipeline_virtual_stages", "data_parallel_shard_size",
                   "activation_checkpointing")


class InitWeights(_Strict):
    """A transformers GPT-2 directory a run starts from, and its weights' hash when the run was launched."""

    path: str = Field(description="Directory with config.json and model.safetensors, as save_pretrained writes it.")
    sha256: str = Field(description="sha256 of model.safetensors; of its shards' `sha256sum` lines where it is "
                        "sharded (model.safetensors.index.json).")


class RunSpec(_Strict):
    """One training run, fully resolved. Written to OUT/spec.json; every rank reads it."""

    data_dir: str
    out_dir: str
    preset: str
    strategy: StrategyName
    precision: PrecisionName
    nproc: int = Field(gt=0)
    nodes: int = Field(1, gt=0, description="Machines the nproc processes spread over, nproc / nodes on each.")
    device: DeviceType
    model: ModelConfig
    size: str | None = Field(None, description="The model size (config.sizes) the model was built at, so that the "
                             "run's record names it; None: the preset's own model. A name: `model` is what computes.")
    train: TrainConfig
    keep_checkpoint: bool = Field(True, description="Keep checkpoint.pt once the run completes (the pipeline "
                                  "drops it: GPT-2 small's is about 1.5 GB per run).")
    final_checkpoint_in_kept: bool = Field(False, description="Once the run completes, move checkpoint.pt into kept/ "
                                           "beside its traces, which a workflow tool declares as an output (the "
                                           "pipeline's study.keep_checkpoints): a tool deletes a failed job's "
                                           "outputs, and checkpoint.pt, what a re-run resumes from, is never one.")
    stale_checkpoint: Literal["fail", "restart"] = Field(
        "fail", description="A checkpoint of other settings: fail (by hand: the directory is another run's) or "
        "restart (a workflow tool re-runs the job because its settings changed).")
    resume_from: str | None = Field(None, description="Another run's checkpoint.pt to continue from when out_dir has "
                                    "none: the same computation, trained so far under another strategy or process "
                                    "count (its checkpoint is in single's layout).")
    init_from: InitWeights | None = Field(None, description="Weights the run starts from instead of GPT-2's "
                                          "random init (--init-from); a checkpoint of its own still resumes.")
    attempt: str | None = Field(None, description="The launch this spec belongs to, set by `gpt2dist train`, "
                                "which writes the run's record; None for ranks started by hand from printed "
                                "commands, whose rank 0 then writes it.")

    def fingerprint(self) -> str:
        """Identity of the run; a checkpoint from another fingerprint is not resumed in its directory."""
        return _digest(self._identity())

    def computation_fingerprint(self) -> str:
        """Identity of what the run computes, whatever strategy and processes compute it: every strategy with the
        same global batch follows single's curve, so a checkpoint of another placement may continue it."""
        identity = self._identity()
        for key in PLACEMENT:
            identity.pop(key)
        for key in PLACEMENT_TRAIN:
            identity["train"].pop(key)
        return _digest(identity)

    def _identity(self) -> dict:
        # where the processes run (nodes) changes no number they compute: a checkpoint resumes on other nodes;
        # nor does which checkpoint a run started from, nor the size's name (its shape is in the model); the weights
        # it started from do, by content, and only where there are such (earlier runs' fingerprints stay)
        identity = self.model_dump(exclude={"out_dir", "data_dir", "keep_checkpoint", "final_checkpoint_in_kept",
                                            "stale_checkpoint", "attempt", "nodes", "resume_from", "size",
                                            "init_from"})
        if self.init_from is not None:
            identity["init_from"] = self.init_from.sha256
        identity["train"].pop("max_steps")  # extending a run is a resume, not a new run
        identity["train"].pop("ledger_steps")  # tracing changes no number the run computes
        identity["train"].pop("checkpoint_minutes")  # nor does when it saves
        return identity


def _digest(identity: dict) -> str:
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]


def validation_message(err: ValidationError, model: type[BaseModel], prefix: str) -> str:
    """pydantic's errors as one line: each bad key with what is wrong, unknown keys with what is allowed."""
    parts = []
    for e in err.errors():
        loc = [str(p) for p in e["loc"]]
        key = ".".join([prefix, *loc] if prefix else loc) or "(root)"
        if e["type"] == "extra_forbidden":
            owner: Any = model
            for name in loc[:-1]:  # stops at unions, whose members pydantic names by tag
                field = owner.model_fields.get(name) if isinstance(owner, type) and issubclass(owner, BaseModel) else None
                owner = field.annotation if field else None
            if isinstance(owner, type) and issubclass(owner, BaseModel):
                parts.append(f"unknown key '{key}' (allowed here: {', '.join(owner.model_fields)})")
            else:
                parts.append(f"unknown key '{key}'")
        else:
            msg = e["msg"].removeprefix("Value error, ")
            parts.append(f"{key}: {msg}")
    return "; ".join(parts)


def write_spec(spec: RunSpec, path: Path) -> None:
    atomic_write_text(path, spec.model_dump_json(indent=2))


def read_spec(path: Path) -> RunSpec:
    return RunSpec.model_validate_json(Path(path).read_text())


def write_params_schema(path: Path) -> None:
    schema = {"$schema": "https://json-schema.org/draft/2020-12/schema", **ParamsFile.model_json_schema()}
    schema["title"] = "gpt2dist params.yaml"
    atomic_write_text(path, json.dumps(schema, indent=2, sort_keys=True) + "\n")
