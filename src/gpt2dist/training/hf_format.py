"""GPT-2 in transformers' files (config.json, model.safetensors, tokenizer files): a run's checkpoint written as
one (`gpt2dist export`), and one read as the weights a run starts from (`gpt2dist train --init-from`).

Read and written with json and safetensors alone, never transformers: a rank would pay about 2.5 s for its
import, and an export should work where it is not installed. The one home of the correspondence between
gpt2dist's parameters and GPT2LMHeadModel's: the names are the same, but transformers' Conv1D keeps its weights
in x out where gpt2.py's nn.Linear keeps them out x in, and the head is tied to the token embedding in both, so
transformers' files leave it out."""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from torch import nn

from gpt2dist import __version__
from gpt2dist.config.schema import InitWeights, ModelConfig
from gpt2dist.config.sizes import parameter_shapes
from gpt2dist.data.encoding import EOS
from gpt2dist.data.shards import sha256_file
from gpt2dist.errors import UsageError
from gpt2dist.io import atomic_directory, file_kind
from gpt2dist.pipeline.layout import KEPT_DIR
from gpt2dist.training.gpt2 import INIT_STD, LAYER_NORM_EPS
from gpt2dist.training.run_record import CHECKPOINT, RECORD, final_checkpoint, now_iso

CONFIG, WEIGHTS, EXPORT_RECORD = "config.json", "model.safetensors", "export.json"
INDEX = "model.safetensors.index.json"  # save_pretrained's, where it shards the weights
CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")  # in x out there
HEAD, PREFIX = "lm_head.weight", "transformer."
EMBEDDING = PREFIX + "wte.weight"
MASKS = (".attn.bias", ".attn.masked_bias")  # causal-mask buffers in older transformers' files: no weights
SHAPE = ("n_layer", "n_head", "n_embd", "n_positions", "vocab_size")
# What a GPT2Config must say for gpt2.py to compute what it computes: key -> (values allowed, value when absent)
ARITHMETIC = {
    "model_type": (("gpt2",), None),
    "activation_function": (("gelu_new", "gelu_pytorch_tanh"), "gelu_new"),  # GELU's tanh approximation
    "layer_norm_epsilon": ((LAYER_NORM_EPS,), LAYER_NORM_EPS),
    "scale_attn_weights": ((True,), True),
    "scale_attn_by_inverse_layer_idx": ((False,), False),
    "add_cross_attention": ((False,), False),
    "tie_word_embeddings": ((True,), True),
}


# -- the correspondence ---------------------------------------------------------------------------------------------
def transformers_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """GPT2LMHeadModel's tensors at `cfg` by name, as its files hold them (the tied head left out)."""
    return {name: shape[::-1] if name.endswith(CONV1D) else shape for name, shape in parameter_shapes(cfg).items()}


def transformers_config(cfg: ModelConfig, *, eos_id: int | None, dtype: str) -> dict:
    """config.json of the GPT2LMHeadModel that computes what gpt2.py computes at `cfg`."""
    arithmetic = {key: allowed[0] for key, (allowed, _) in ARITHMETIC.items()}
    return {"architectures": ["GPT2LMHeadModel"], **arithmetic, **{key: getattr(cfg, key) for key in SHAPE},
            "n_inner": None, "resid_pdrop": cfg.dropout, "embd_pdrop": cfg.dropout, "attn_pdrop": cfg.dropout,
            "initializer_range": INIT_STD, "reorder_and_upcast_attn": False, "bos_token_id": eos_id,
            "eos_token_id": eos_id, "dtype": dtype, "use_cache": True}


def _canonical(name: str) -> str | None:
    """A GPT-2 file's tensor under GPT2LMHeadModel's name (the base model's files lack `transformer.`); None for a
    causal-mask buffer."""
    if name.endswith(MASKS):
        return None
    return name if name.startswith(PREFIX) or name == HEAD else PREFIX + name


def shape_problems(found: Mapping[str, tuple[int, ...]], expected: Mapping[str, tuple[int, ...]]) -> str | None:
    """What `found` lacks, has besides or shapes otherwise than `expected`, in words; None when nothing."""
    missing = [name for name in expected if name not in found]
    extra = [name for name in found if name not in expected]
    shaped = [f"{name} {list(found[name])} (GPT-2's: {list(shape)})" for name, shape in expected.items()
              if name in found and tuple(found[name]) != tuple(shape)]
    parts = [f"{label} {', '.join(names[:3])}{' ...' if len(names) > 3 else ''}"
             for label, names in (("no", missing), ("besides", extra), ("shaped", shaped)) if names]
    return "; ".join(parts) or None


def to_transformers(state: Mapping[str, torch.Tensor], cfg: ModelConfig, where: str) -> dict[str, torch.Tensor]:
    """gpt2dist's parameters (a checkpoint's "model") as GPT2LMHeadModel's files hold them: Conv1D weights
    transposed, the head left out (transformers ties it to wte again); refused where transformers' GPT-2 at `cfg`
    cannot express them."""
    tensors = {name: tensor for name, tensor in state.items() if name != HEAD}
    problems = shape_problems({name: tuple(t.shape) for name, t in tensors.items()}, parameter_shapes(cfg))
    if problems is None and HEAD in state and not torch.equal(state[HEAD], tensors[EMBEDDING]):
        problems = f"{HEAD} differs from {EMBEDDING}, and transformers' GPT-2 ties them"
    if problems:
        raise UsageError(f"{where} holds a model that transformers' GPT-2 at its run's shape cannot express: "
                         f"{problems}")
    # clone: contiguous, and no two tensors share memory, which safetensors refuses
    return {name: (t.t() if name.endswith(CONV1D) else t).clone(memory_format=torch.contiguous_format)
            for name, t in tensors.items()}


def from_transformers(tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A transformers GPT-2's tensors (already checked by read_source) as gpt2dist's state dict."""
    state = {}
    for name, tensor in tensors.items():
        name = _canonical(name)
        if name is not None and name != HEAD:
            state[name] = tensor.t() if name.endswith(CONV1D) else tensor
    return {**state, HEAD: state[EMBEDDING]}


# -- a transformers directory a run starts from ---------------------------------------------------------------------
def _weight_files(directory: Path) -> list[Path]:
    if (directory / WEIGHTS).is_file():
        return [directory / WEIGHTS]
    if (directory / INDEX).is_file():
        try:
            shards = sorted(set(json.loads((directory / INDEX).read_text())["weight_map"].values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            shards = []
        if not shards or not all(isinstance(name, str) for name in shards):
            raise UsageError(f"--init-from {directory}: {INDEX} is no safetensors index (a weight_map naming files)")
        return [directory / name for name in shards]
    raise UsageError(f"--init-from {directory} has no {WEIGHTS}: save the model there with save_pretrained, whose "
                     "default format that is (a pytorch_model.bin is not read)")


def _config_problems(config: Mapping, cfg: ModelConfig) -> tuple[list[str], list[str]]:
    """(what it says that gpt2.py does not compute, or leaves unsaid; the shape keys that differ from the run's
    model, which `--set` changes)."""
    lacks = [f"{key} {config.get(key, absent)!r}" for key, (allowed, absent) in ARITHMETIC.items()
             if config.get(key, absent) not in allowed]
    if config.get("n_inner") not in (None, 4 * cfg.n_embd):
        lacks.append(f"n_inner {config.get('n_inner')!r} (gpt2.py's MLP is 4 x n_embd wide)")
    lacks += [f"no {key}" for key in SHAPE if type(config.get(key)) is not int]
    return lacks, [key for key in SHAPE if config.get(key) != getattr(cfg, key)]


def read_source(directory: Path, cfg: ModelConfig) -> InitWeights:
    """A transformers GPT-2 directory checked against the run's model (arithmetic, shape, every tensor's name and
    shape, a tied head) without loading it whole, and the hash of its weights."""
    directory = Path(directory).resolve()
    if not directory.is_dir():
        kind = file_kind(directory)
        what = "does not exist" if kind == "missing" else f"is {kind}, not a directory"
        raise UsageError(f"--init-from {directory} {what}: name the directory holding {CONFIG} and {WEIGHTS} "
                         "(save_pretrained writes them)")
    try:
        config = json.loads((directory / CONFIG).read_text())
    except (OSError, ValueError) as exc:
        raise UsageError(f"--init-from {directory}: {CONFIG} cannot be read ({exc.__class__.__name__}); it should "
                         "be a transformers GPT2Config's (save_pretrained writes it)") from None
    if not isinstance(config, dict):
        raise UsageError(f"--init-from {directory}: {CONFIG} is no GPT2Config (not a JSON object)")
    lacks, differ = _config_problems(config, cfg)
    if lacks:
        raise UsageError(f"--init-from {directory}: its {CONFIG} describes a model that gpt2dist's GPT-2 does not "
                         f"compute ({', '.join(lacks)}); start from a GPT2LMHeadModel of transformers' default "
                         "arithmetic, saved with save_pretrained")
    if differ:
        theirs = ", ".join(f"{key} {config.get(key)!r} (the preset's model: {getattr(cfg, key)})" for key in differ)
        fix = " ".join(f"--set model.{key}={config.get(key)}" for key in differ)
        raise UsageError(f"--init-from {directory} is a GPT-2 of {theirs}; train at its shape ({fix}) or start from "
                         "weights of the preset's shape")
    files = _weight_files(directory)
    found: dict[str, tuple[int, ...]] = {}
    try:
        for path in files:
            with safe_open(path, framework="pt") as handle:
                for name in handle.keys():
                    if (canonical := _canonical(name)) is not None:
                        found[canonical] = tuple(handle.get_slice(name).get_shape())
    except (OSError, SafetensorError) as exc:
        raise UsageError(f"--init-from {directory}: {path.name} cannot be read as safetensors "
                         f"({' '.join(str(exc).split())[:120]})") from None
    problems = shape_problems({name: shape for name, shape in found.items() if name != HEAD},
                              transformers_shapes(cfg))
    if problems is None and HEAD in found:
        head, embedding = (_tensor(files, name) for name in (HEAD, EMBEDDING))
        problems = None if torch.equal(head, embedding) else f"{HEAD} differs from {EMBEDDING} (an untied head)"
    if problems:
        raise UsageError(f"--init-from {directory}: its weights are not GPT-2's at its config.json's shape "
                         f"({problems})")
    return InitWeights(path=str(directory), sha256=weights_sha256(files))


def _tensor(files: list[Path], canonical: str) -> torch.Tensor:
    for path in files:
        with safe_open(path, framework="pt") as handle:
            for name in handle.keys():
                if _canonical(name) == canonical:
                    return handle.get_tensor(name)
    raise KeyError(canonical)


def weights_sha256(files: list[Path]) -> str:
    """One file's sha256 (what `sha256sum model.safetensors` prints); for shards, that of their `sha256sum` lines."""
    if len(files) == 1:
        return sha256_file(files[0])
    lines = "".join(f"{sha256_file(path)}  {path.name}\n" for path in files)
    return hashlib.sha256(lines.encode()).hexdigest()


def load_init(model: nn.Module, init: InitWeights, cfg: ModelConfig) -> None:
    """Copy the weights `init` names into the single-layout model before a strategy places it. Every rank reads
    them, as every rank reads a checkpoint it resumes, and checks they are those the run was launched with."""
    now = read_source(Path(init.path), cfg)
    if now.sha256 != init.sha256:
        raise UsageError(f"--init-from {init.path}: its weights changed since the run was launched (sha256 "
                         f"{now.sha256[:12]}, launched with {init.sha256[:12]}); launch the run again")
    tensors = {}
    for path in _weight_files(Path(init.path)):
        with safe_open(path, framework="pt") as handle:
            tensors |= {name: handle.get_tensor(name) for name in handle.keys()}
    model.load_state_dict(from_transformers(tensors))


# -- a run's checkpoint written as a transformers directory -----------------------------------------------------------
def _data_meta(data_dir: Path) -> dict | None:
    try:
        meta = json.loads((data_dir / "meta.json").read_text())
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) else None


def _tokenizer(data_dir: Path, meta: dict | None, n_positions: int) -> tuple[dict[str, bytes], dict | None, str | None]:
    """The files that give transformers the run's tokenizer (tokenizer.json as `gpt2dist prepare` saved it, which
    PreTrainedTokenizerFast loads, for GPT-2's and trained BPE tokenizers alike), what it is, or why there are
    none."""
    if meta is None:
        return {}, None, f"the run's data ({data_dir}) is gone or has no readable meta.json"
    described = meta.get("tokenizer")
    if not isinstance(described, dict) or not isinstance(described.get("file"), str) or not described["file"]:
        return {}, None, (f"the run's data ({data_dir}) names no tokenizer file (its tokens were not written by "
                          "`gpt2dist prepare`)")
    try:
        text = (data_dir / described["file"]).read_bytes()
    except OSError:
        return {}, None, f"the run's tokenizer {data_dir / described['file']} is gone"
    if hashlib.sha256(text).hexdigest() != described.get("sha256"):
        return {}, None, f"the run's tokenizer {data_dir / described['file']} differs from what its meta.json records"
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": EOS, "eos_token": EOS, "unk_token": EOS,
              "model_max_length": n_positions, "add_prefix_space": False, "clean_up_tokenization_spaces": False}
    files = {"tokenizer.json": text, "tokenizer_config.json": (json.dumps(config, indent=2) + "\n").encode()}
    return files, {key: described.get(key) for key in ("kind", "name", "vocab_size", "sha256")}, None


def _run_config(run: Path) -> tuple[dict, dict, ModelConfig]:
    """The run's record and its resolved settings (the record's "config")."""
    try:
        record = json.loads((run / RECORD).read_text())
        config = record["config"]
        return record, config, ModelConfig.model_validate(config["model"])
    except OSError:
        raise UsageError(f"{run} has no {RECORD}: export reads the run's model settings from its record") from None
    except (ValueError, KeyError, TypeError):  # pydantic's ValidationError is a ValueError
        raise UsageError(f"{run / RECORD} holds no model settings (config.model) that gpt2dist can read; export a "
                         "run that gpt2dist train recorded") from None


def export_run(run: Path, out: Path) -> dict:
    """Write the run's checkpoint as a directory that transformers' GPT2LMHeadModel.from_pretrained loads offline:
    config.json, model.safetensors, the tokenizer's files where the run's data has them, the run's record and
    export.json saying what was exported. Built beside `out` and renamed into place; returns export.json's record."""
    run, out = Path(run), Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UsageError(f"--out {out} exists and is not an empty directory; export into a new or empty one")
    checkpoint = final_checkpoint(run)
    kind = file_kind(checkpoint)
    if kind != "a torch checkpoint":
        what = (f"has no {CHECKPOINT} (nor {KEPT_DIR}/{CHECKPOINT})" if kind == "missing" else
                f"has a {checkpoint.relative_to(run)} that is {kind}, not a checkpoint")
        raise UsageError(f"--run {run} {what}: export needs a run's checkpoint (a run keeps it unless trained with "
                         "--no-keep-checkpoint, a study its configurations' first repeats' unless study."
                         "keep_checkpoints says otherwise; a run stopped before its first checkpoint has none)")
    record, config, cfg = _run_config(run)
    try:
        payload = torch.load(checkpoint, map_location="cpu", weights_only=False, mmap=True)
    except Exception as exc:  # a damaged archive fails in torch's and pickle's many ways
        raise UsageError(f"{checkpoint} cannot be read ({type(exc).__name__}); export a checkpoint that gpt2dist "
                         "train saved") from None
    if not isinstance(payload, dict) or not isinstance(payload.get("model"), dict):
        raise UsageError(f"{checkpoint} holds no model state; export a checkpoint that gpt2dist train saved")
    if payload.get("fingerprint") != record.get("fingerprint"):
        raise UsageError(f"{checkpoint} belongs to other settings (fingerprint {payload.get('fingerprint')}) than "
                         f"{run / RECORD} ({record.get('fingerprint')}); export a run directory as training left it")
    tensors = to_transformers(payload["model"], cfg, str(checkpoint))
    dtype = str(tensors[EMBEDDING].dtype).removeprefix("torch.")
    data_dir = Path(config.get("data_dir") or "")
    meta = _data_meta(data_dir)
    tokenizer_files, tokenizer, no_tokenizer = _tokenizer(data_dir, meta, cfg.n_positions)
    eos_id = meta.get("eos_id") if meta and isinstance(meta.get("eos_id"), int) else None
    with atomic_directory(out) as work:
        save_file(tensors, work / WEIGHTS, metadata={"format": "pt"})  # transformers reads the format
        (work / CONFIG).write_text(json.dumps(transformers_config(cfg, eos_id=eos_id, dtype=dtype), indent=2) + "\n")
        for name, content in tokenizer_files.items():
            (work / name).write_bytes(content)
        shutil.copyfile(run / RECORD, work / RECORD)
        exported = {"run": str(run.resolve()), "run_id": record.get("run_id"), "strategy": record.get("strategy"),
                    "nproc": record.get("nproc"), "precision": record.get("precision"),
                    "checkpoint_step": payload.get("step"), "fingerprint": payload.get("fingerprint"),
                    "started_from": config.get("init_from"), "dtype": dtype, "parameters": sum(
                        t.numel() for t in tensors.values()), "weights_sha256": sha256_file(work / WEIGHTS),
                    "tokenizer": tokenizer, "no_tokenizer": no_tokenizer, "exported_at": now_iso(),
                    "gpt2dist": __version__}
        (work / EXPORT_RECORD).write_text(json.dumps(exported, indent=2, sort_keys=True) + "\n")
    return exported

