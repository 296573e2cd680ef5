"""Typed configuration: params.yaml -> chosen preset -> --set overrides -> validated RunSpec.

params.yaml is the only parameter file (Snakemake and DVC read it too). Everything a
training rank needs is resolved here once, in the launching process, and handed to the
ranks as a JSON RunSpec, so every rank and every launcher sees the same values and bad
input fails before any process group exists.
"""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path
from typing import Any, Literal, get_args

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from gpt2dist.errors import UsageError
from gpt2dist.io import atomic_write_text

# torch.distributed's rendezvous port: launchers pass it, and ranks that SLURM starts derive theirs from it.
DEFAULT_PORT = 29500

Strategy = Literal["single", "dp", "ddp", "horovod", "fsdp", "tp", "pp", "fsdp-tp", "apex-ddp"]
# Strategies that split the model itself over their processes; each such group trains one replica.
MODEL_PARALLEL = ("tp", "pp", "fsdp-tp")
# What starts a strategy's processes: known here, before torch loads, so that `gpt2dist train` can plan its
# launch without importing every strategy (a second of start-up per run). "python": one process drives
# every device (single, and dp's one process that scatters over GPUs).
LAUNCHERS: dict[str, str] = {"single": "python", "dp": "python", "ddp": "torchrun", "apex-ddp": "torchrun",
                             "fsdp": "torchrun", "tp": "torchrun", "pp": "torchrun", "fsdp-tp": "torchrun",
                             "horovod": "horovodrun"}
# A pipeline stage idles while the others compute (the bubble): its CPU share says nothing of the machine.
IDLE_BY_DESIGN = ("pp",)
# fp32 is IEEE fp32 everywhere; tf32 is fp32 with TF32 tensor-core matmuls (NVIDIA containers' default).
Precision = Literal["fp32", "tf32", "fp16", "bf16", "apex-O1", "apex-O2"]
DeviceType = Literal["cpu", "cuda"]
STRATEGIES: tuple[str, ...] = get_args(Strategy)
PRECISIONS: tuple[str, ...] = get_args(Precision)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelConfig(_Strict):
    """GPT-2 architecture (transformers' GPT2Config names)."""

    n_layer: int = Field(gt=0, description="Transformer blocks.")
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


class TrainConfig(_Strict):
    """Optimisation and bookkeeping. The global batch is what makes strategies comparable."""

    global_batch_size: int = Field(gt=0, description="Sequences per optimizer step, for every strategy.")
    micro_batch_size: int = Field(gt=0, description="Sequences per forward pass per device.")
    max_steps: int = Field(gt=0, description="Optimizer steps.")
    lr: float = Field(gt=0, description="Peak learning rate (AdamW).")
    min_lr: float = Field(ge=0, description="Learning rate at the end of the cosine decay.")
    warmup_steps: int = Field(0, ge=0, description="Linear warm-up steps before the cosine decay.")
    weight_decay: float = Field(0.1, ge=0)
    beta1: float = Field(0.9, gt=0, lt=1)
    beta2: float = Field(0.95, gt=0, lt=1)
    grad_clip: float = Field(1.0, ge=0, description="Max global grad norm; 0 disables clipping.")
    eval_interval: int = Field(gt=0, description="Evaluate on the validation split every this many steps.")
    eval_batches: int = Field(gt=0, description="Global batches per evaluation.")
    checkpoint_interval: int = Field(gt=0, description="Write a resumable checkpoint every this many steps.")
    compile: bool = Field(False, description="torch.compile each transformer block.")
    fsdp_mixed_precision: bool = Field(
        False,
        description="fsdp with bf16 or fp16 only: FSDP2's MixedPrecisionPolicy, parameters all-gathered and "
                    "computed in that dtype, gradients reduced in fp32. Off (default): fp32 communication, as DDP.",
    )
    tensor_parallel_size: int = Field(2, gt=1, description="fsdp-tp only: processes that split each layer "
                                      "(tensor parallel); FSDP shards over nproc / tensor_parallel_size replicas.")
    pipeline_schedule: Literal["gpipe", "1f1b"] = Field(
        "1f1b", description="pp only: GPipe (all forwards, then all backwards) or 1F1B (interleaved, fewer "
        "activations held). The global batch is one pipeline step of global_batch_size / micro_batch_size micro-batches.")
    seed: int = Field(1337, ge=0, description="Seeds init, data order and dropout.")

    @model_validator(mode="after")
    def _lr_order(self) -> TrainConfig:
        if self.min_lr > self.lr:
            raise ValueError(f"min_lr ({self.min_lr}) must not exceed lr ({self.lr})")
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

    strategies: list[Strategy] = Field(min_length=1)
    precisions: list[Precision] = Field(min_length=1)
    nproc: list[int] = Field(min_length=1, description="Processes (GPUs on CUDA machines) per run.")
    label: str | None = Field(None, description="What a paper calls these runs (e.g. 'Horovod + Apex'), shown "
                              "beside the configuration in tables and figures.")
    nodes: int = Field(1, ge=1, description="Nodes the processes spread over. Above 1, nodes emulated on this machine "
                       "(network namespaces, needs root; CPU only, the nodes share its cores).")
    link_mbit: list[float] = Field([], description="With nodes > 1: each node's link bandwidth, Mbit/s each way, "
                                   "one run per value (empty: unshaped).")

    @model_validator(mode="after")
    def _positive(self) -> RunGroup:
        if any(n < 1 for n in self.nproc):
            raise ValueError(f"nproc values must be >= 1, got {self.nproc}")
        if self.nodes > 1 and any(n % self.nodes for n in self.nproc):
            raise ValueError(f"nproc values must be multiples of nodes ({self.nodes}), got {self.nproc}")
        if self.link_mbit and self.nodes == 1:
            raise ValueError("link_mbit shapes emulated nodes' links; set nodes to 2 or more")
        if any(rate <= 0 for rate in self.link_mbit):
            raise ValueError(f"link_mbit values must be positive, got {self.link_mbit}")
        return self


class StudyConfig(_Strict):
    """Which runs the pipeline trains and how their numbers are summarised."""

    repeats: int = Field(3, ge=1, description="Repeats per configuration (3 or more give confidence intervals).")
    warmup_steps: int = Field(5, ge=0, description="Leading steps left out of throughput statistics.")
    train_runtime_min: int = Field(60, gt=0, description="Time limit of one train job on a cluster (SLURM "
                                   "--time), minutes; a job that hits it is retried and resumes from its checkpoint.")
    max_foreign_cpu_share: float = Field(0.1, ge=0, le=1, description="A run is disturbed when other processes "
                                         "used more than this share of its CPUs during its steady-state steps (mean of the load samples).")
    max_step_time_spread: float = Field(0.25, gt=0, description="A run is disturbed when its steady-state step times "
                                        "spread more than this (median absolute deviation / median).")
    min_cpu_share: float = Field(0.6, ge=0, le=1, description="On CPU, a run is disturbed when rank 0 got less than "
                                 "this share of its compute threads' time (median CPU time / (step time x threads)). "
                                 "Waiting on communication counts as idle: undisturbed tp and fsdp ranks at 2 processes "
                                 "get 0.74-0.87; a starved one far less. Not applied to pp, whose stages idle by design, "
                                 "nor on emulated nodes' shaped links, where ranks wait for the link.")
    max_disturbed: int | None = Field(None, ge=0, description="collect refuses the study when more runs than this "
                                      "are disturbed, naming the command that re-runs them; null: mark them, leave "
                                      "them out of the statistics, and go on.")
    runs: list[RunGroup] = Field(min_length=1)


class Preset(_Strict):
    data: DataConfig
    model: ModelConfig
    train: TrainConfig
    study: StudyConfig


class ParamsFile(_Strict):
    """The whole params.yaml; its JSON schema (workflow/schemas/) is generated from this."""

    preset: str = Field("auto", description="A preset name, or auto: paper with CUDA GPUs, cpu without.")
    gpus_per_node: int | None = Field(
        None, ge=0, description="GPUs per node the study is planned for; null: the GPUs visible where it is "
        "planned. Set it (or `snakemake --config gpus_per_node=8`) when planning on a login node without GPUs.")
    container: str = Field(description="Image every pipeline rule runs in under --sdm apptainer.")
    presets: dict[str, Preset] = Field(min_length=1)


class RunSpec(_Strict):
    """One training run, fully resolved. Written to OUT/spec.json; every rank reads it."""

    data_dir: str
    out_dir: str
    preset: str
    strategy: Strategy
    precision: Precision
    nproc: int = Field(gt=0)
    device: DeviceType
    model: ModelConfig
    train: TrainConfig
    keep_checkpoint: bool = Field(True, description="Keep checkpoint.pt once the run completes (the pipeline "
                                  "drops it: GPT-2 small's is about 1.5 GB per run).")
    stale_checkpoint: Literal["fail", "restart"] = Field(
        "fail", description="A checkpoint of other settings: fail (by hand: the directory is another run's) or "
        "restart (a workflow tool re-runs the job because its settings changed).")

    @property
    def world_size(self) -> int:
        """Processes the run starts (dp is one process driving nproc devices)."""
        return 1 if self.strategy in ("single", "dp") else self.nproc

    @property
    def tensor_parallel_size(self) -> int:
        """Processes that split each layer: all of them under tp, train.tensor_parallel_size under fsdp-tp."""
        return {"tp": self.nproc, "fsdp-tp": self.train.tensor_parallel_size}.get(self.strategy, 1)

    @property
    def replicas(self) -> int:
        """Data-parallel groups, each reading its own share of the global batch."""
        if self.strategy in ("single", "dp", "tp", "pp"):
            return 1
        return self.nproc // self.tensor_parallel_size

    @property
    def rows_per_pass(self) -> int:
        """Sequences one replica feeds to one forward pass: dp scatters nproc micro-batches at once,
        and pp's one pipeline step takes the whole global batch as its micro-batches."""
        t = self.train
        return {"dp": t.micro_batch_size * self.nproc, "pp": t.global_batch_size}.get(self.strategy, t.micro_batch_size)

    @property
    def pipeline_micro_batches(self) -> int:
        """Micro-batches pp's one pipeline step per optimizer step splits the global batch into."""
        return self.train.global_batch_size // self.train.micro_batch_size

    @property
    def grad_accum_steps(self) -> int:
        return self.train.global_batch_size // (self.replicas * self.rows_per_pass)

    def fingerprint(self) -> str:
        """Identity of the computation; a checkpoint from another fingerprint is not resumed."""
        identity = self.model_dump(exclude={"out_dir", "data_dir", "keep_checkpoint", "stale_checkpoint"})
        identity["train"].pop("max_steps")  # extending a run is a resume, not a new run
        blob = json.dumps(identity, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


def _format_validation_error(err: ValidationError, model: type[BaseModel], prefix: str) -> str:
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


def _apply_override(tree: dict, assignment: str) -> None:
    key, sep, raw_value = assignment.partition("=")
    if not sep or not key:
        raise UsageError(f"--set '{assignment}' is not of the form key=value (e.g. model.n_layer=2)")
    *parents, leaf = key.split(".")
    node = tree
    for name in parents:
        child = node.setdefault(name, {})
        if not isinstance(child, dict):
            raise UsageError(f"--set '{assignment}': '{name}' is a value, not a section")
        node = child
    node[leaf] = yaml.safe_load(raw_value)


def read_params(path: Path) -> dict:
    """The raw params.yaml mapping, with one-line errors for a missing or malformed file."""
    try:
        raw = yaml.safe_load(Path(path).read_text())
    except FileNotFoundError:
        raise UsageError(f"params file {path} not found (pass --params FILE)") from None
    except yaml.YAMLError as exc:
        raise UsageError(f"params file {path} is not valid YAML: {exc}".replace("\n", " ")) from None
    if not isinstance(raw, dict) or not isinstance(raw.get("presets"), dict):
        raise UsageError(f"params file {path} has no 'presets' mapping")
    return raw


def resolve_preset_name(raw: dict, requested: str | None, cuda_available: bool) -> str:
    """'auto' picks the GPU-scale preset when CUDA is visible and the CPU-scale one otherwise."""
    name = requested or raw.get("preset", "auto")
    if name == "auto":
        name = "paper" if cuda_available else "cpu"
    if name not in raw["presets"]:
        raise UsageError(f"unknown preset '{name}' (available: {', '.join(raw['presets'])})")
    return name


def planned_gpus(path: Path, visible: int) -> int:
    """GPUs per node to plan a study for: params.yaml's gpus_per_node, else those visible here."""
    gpus = read_params(path).get("gpus_per_node")
    if gpus is None:
        return visible
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 0:
        raise UsageError(f"gpus_per_node in {path} must be a whole number of GPUs per node, 0 or more (not {gpus!r})")
    return gpus


def check_plan_fits(path: Path, planned: int, visible: int) -> None:
    """Refuse a CPU plan (--gpus 0, as the committed dvc.yaml has) on a machine with GPUs: it would
    train the CPU study on CUDA, or fail at its first 2-process run. A CPU study on a GPU machine
    stays possible by saying so in params.yaml."""
    if planned == 0 and visible > 0 and read_params(path).get("gpus_per_node") is None:
        raise UsageError(
            f"this study was planned for CPU (--gpus 0, as in the committed dvc.yaml) but this machine has {visible} "
            f"CUDA GPUs; regenerate the plan with `gpt2dist dvc-yaml` (or set gpus_per_node: 0 in {path} to run "
            f"the CPU study here)"
        )


def load_preset(path: Path, name: str, overrides: list[str] | tuple[str, ...] = ()) -> Preset:
    return _preset_from(read_params(path), path, name, overrides)


def choose_preset(path: Path, requested: str | None, cuda_available: bool,
                  overrides: list[str] | tuple[str, ...] = ()) -> tuple[str, Preset]:
    """Resolve the preset's name ('auto' included) and load it, reading params.yaml once."""
    raw = read_params(path)
    name = resolve_preset_name(raw, requested, cuda_available)
    return name, _preset_from(raw, path, name, overrides)


def _preset_from(raw: dict, path: Path, name: str, overrides: list[str] | tuple[str, ...]) -> Preset:
    if name not in raw["presets"]:
        raise UsageError(f"unknown preset '{name}' (available: {', '.join(raw['presets'])})")
    tree = copy.deepcopy(raw["presets"][name])
    for assignment in overrides:
        _apply_override(tree, assignment)
    try:
        return Preset.model_validate(tree)
    except ValidationError as err:
        raise UsageError(f"{path} preset '{name}': {_format_validation_error(err, Preset, '')}") from None


def check_combination(spec: RunSpec, visible_gpus: int) -> None:
    """Reject combinations that cannot run, naming the key and what is allowed."""
    t = spec.train
    if spec.strategy == "single" and spec.nproc != 1:
        raise UsageError(f"strategy 'single' runs one process; got --nproc {spec.nproc} (use ddp, fsdp or horovod)")
    if spec.strategy == "dp":
        limit = max(visible_gpus, 1)
        if spec.nproc > limit:
            raise UsageError(
                f"strategy 'dp' drives one device per --nproc; {spec.nproc} requested but "
                f"{visible_gpus} CUDA GPUs are visible (use --nproc {limit})"
            )
    _check_model_parallel(spec)
    if spec.strategy == "apex-ddp":
        if spec.device != "cuda":
            raise UsageError("strategy 'apex-ddp' (apex.parallel.DistributedDataParallel) needs CUDA GPUs; on CPU "
                             "use ddp")
        if spec.precision in ("fp16", "bf16"):
            raise UsageError(f"strategy 'apex-ddp' pairs with Apex amp (apex-O1, apex-O2) or fp32, not torch.amp's "
                             f"{spec.precision}; use ddp for {spec.precision}")
    if spec.precision.startswith("apex"):
        if spec.strategy in ("fsdp", *MODEL_PARALLEL):
            raise UsageError(f"precision 'apex-*' cannot wrap {spec.strategy}'s sharded or split parameters; use "
                             f"{spec.strategy} with bf16 or fp16")
        if spec.strategy == "dp" and spec.precision == "apex-O2":
            # O2 patches forward on the model object; DataParallel's replicas copy that bound
            # method and so all run the cuda:0 model.
            raise UsageError("precision 'apex-O2' patches the model's forward, which DataParallel replicas would "
                             "share with cuda:0; use dp with apex-O1, or ddp with apex-O2")
        if spec.device != "cuda":
            raise UsageError(f"precision '{spec.precision}' needs CUDA; on CPU use bf16 or fp16 (torch.amp)")
    if t.fsdp_mixed_precision and (spec.strategy != "fsdp" or spec.precision not in ("bf16", "fp16")):
        raise UsageError(
            f"train.fsdp_mixed_precision applies to --strategy fsdp with --precision bf16 or fp16, not "
            f"{spec.strategy} with {spec.precision}; set train.fsdp_mixed_precision=false"
        )
    per_step = spec.replicas * t.micro_batch_size * (spec.nproc if spec.strategy == "dp" else 1)
    if t.global_batch_size % per_step:
        share = "nproc" if spec.replicas > 1 or spec.strategy == "dp" else "1 (one replica)"
        if spec.strategy == "fsdp-tp":
            share = "nproc / train.tensor_parallel_size"
        raise UsageError(
            f"train.global_batch_size ({t.global_batch_size}) must be divisible by {share} x "
            f"train.micro_batch_size ({per_step // t.micro_batch_size} x {t.micro_batch_size} = {per_step})"
        )
    if spec.device == "cuda" and spec.strategy != "dp" and spec.nproc > visible_gpus:
        raise UsageError(f"--nproc {spec.nproc} exceeds the {visible_gpus} visible CUDA GPUs")


def _check_model_parallel(spec: RunSpec) -> None:
    """How far the model itself can be split: heads and MLP columns over tensor-parallel ranks,
    blocks over pipeline stages."""
    m, tp = spec.model, spec.tensor_parallel_size
    if spec.strategy == "fsdp-tp" and spec.nproc % tp:
        raise UsageError(f"strategy 'fsdp-tp' needs nproc ({spec.nproc}) divisible by train.tensor_parallel_size "
                         f"({tp}), e.g. --nproc {2 * tp}")
    if tp > 1 and m.n_head % tp:
        raise UsageError(f"{spec.strategy} splits attention heads over {tp} ranks, but model.n_head ({m.n_head}) is "
                         f"not divisible by {tp}; use a process count that divides {m.n_head}")
    if spec.strategy in ("tp", "fsdp-tp") and spec.precision == "fp16" and spec.device == "cuda":
        # seen on an H100 (torch 2.11): aten._amp_foreach_non_finite_check_and_unscale_ got mixed Tensor and DTensor
        raise UsageError(f"strategy '{spec.strategy}' with fp16 on CUDA: the loss scaler checks all gradients in one "
                         "fused kernel, which refuses tensor parallelism's mix of DTensor and plain gradients; use "
                         f"{spec.strategy} with bf16")
    if spec.strategy == "pp" and spec.precision == "fp16":
        raise UsageError("strategy 'pp' runs backward inside the pipeline schedule, where fp16's loss scaler cannot "
                         "wrap it; use pp with bf16")
    if spec.strategy == "pp" and spec.nproc > m.n_layer:
        raise UsageError(f"strategy 'pp' puts at least one block on each of its {spec.nproc} stages, but the model "
                         f"has {m.n_layer} (model.n_layer); use --nproc {m.n_layer} or fewer")
    micro_batches = spec.pipeline_micro_batches
    if spec.strategy == "pp" and spec.train.pipeline_schedule == "1f1b" and micro_batches < spec.nproc:
        # torch's Schedule1F1B fills the pipeline with one micro-batch per stage before its first backward
        raise UsageError(f"train.pipeline_schedule '1f1b' needs at least one micro-batch per stage, but "
                         f"global_batch_size / micro_batch_size is {micro_batches} for {spec.nproc} stages; use a "
                         f"smaller train.micro_batch_size, or train.pipeline_schedule=gpipe")


def write_spec(spec: RunSpec, path: Path) -> None:
    atomic_write_text(path, spec.model_dump_json(indent=2))


def read_spec(path: Path) -> RunSpec:
    return RunSpec.model_validate_json(Path(path).read_text())


def write_params_schema(path: Path) -> None:
    schema = {"$schema": "https://json-schema.org/draft/2020-12/schema", **ParamsFile.model_json_schema()}
    schema["title"] = "gpt2dist params.yaml"
    atomic_write_text(path, json.dumps(schema, indent=2, sort_keys=True) + "\n")
