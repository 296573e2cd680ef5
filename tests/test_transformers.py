"""gpt2dist's GPT-2 leaves and enters through transformers: the same logits as GPT2LMHeadModel on the same weights,
a run of every strategy family exported and loaded by from_pretrained, a run started from a transformers directory,
and ranks that never import transformers. transformers is a test dependency only; nothing is downloaded."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import yaml
from safetensors import safe_open
from safetensors.torch import save_file
from tokenizers import Tokenizer
from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel

from gpt2dist.config.presets import load_params
from gpt2dist.config.schema import DataConfig, ModelConfig
from gpt2dist.data.prepare import prepare
from gpt2dist.data.shards import open_shards, sha256_file
from gpt2dist.errors import UsageError
from gpt2dist.launch.runner import build_spec
from gpt2dist.training.batches import BatchSampler
from gpt2dist.training.hf_format import export_run, from_transformers, load_init, read_source
from gpt2dist.training.model import build_model

from conftest import TINY_PRESET, final_params, gpt2dist, read_metrics, run_record, train_args
from test_cli_properties import invoke

TINY = ModelConfig(**TINY_PRESET["model"])
FP32 = 1e-5  # the brief's tolerance; measured gaps are about 1e-6
DOCS = [f"Document {i}: the quick brown fox jumps over the lazy dog {i} times.\nSecond line {i * 7}."
        for i in range(80)]


def transformers_gpt2(seed: int, **shape) -> GPT2LMHeadModel:
    """transformers' GPT-2 at the tiny preset's shape (or `shape`), eager attention, in eval mode, every tensor drawn
    from a seeded normal: zero biases and unit LayerNorm gains, transformers' init, would hide one put in the wrong
    place, and weights ten times GPT-2's scale make its predictions far from uniform."""
    config = GPT2Config(**{key: getattr(TINY, key) for key in ("n_layer", "n_head", "n_embd", "n_positions",
                                                                "vocab_size")} | shape,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    config._attn_implementation = "eager"
    model = GPT2LMHeadModel(config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, tensor in model.named_parameters():
            noise = torch.randn(tensor.shape, generator=generator) * 0.2
            tensor.copy_(noise + 1 if name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")) else noise)
    return model.eval()


def gpt2dist_logits(model, ids: torch.Tensor) -> torch.Tensor:
    """The tied head's logits: gpt2dist's forward stops at the final hidden states (the loss applies the head)."""
    with torch.no_grad():
        return F.linear(model(ids), model.lm_head.weight)


def hf_logits(model: GPT2LMHeadModel, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(ids).logits


def gap(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item()


def ids(rows: int = 3) -> torch.Tensor:
    return torch.randint(0, TINY.vocab_size, (rows, TINY.n_positions), generator=torch.Generator().manual_seed(5))


def from_pretrained(directory: Path) -> GPT2LMHeadModel:
    """transformers' own loader, offline; a tensor it had to make up (missing) or left over fails the test."""
    model, info = GPT2LMHeadModel.from_pretrained(directory, attn_implementation="eager", local_files_only=True,
                                                  output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    return model.eval()


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    """A transformers GPT-2 directory at the tiny preset's shape, as save_pretrained writes it."""
    directory = tmp_path_factory.mktemp("transformers") / "source"
    transformers_gpt2(seed=2).save_pretrained(directory)
    return directory


def test_gpt2dist_computes_transformers_logits_and_a_transposed_weight_is_caught():
    """The same weights, fp32, eval, eager attention: the same logits to 1e-5. The control: one square weight
    transposed in the copy (what a missed Conv1D orientation does) is caught."""
    theirs = transformers_gpt2(seed=0)
    ours = build_model(TINY, seed=1).eval()
    ours.load_state_dict(from_transformers(theirs.state_dict()))
    assert gap(gpt2dist_logits(ours, ids()), hf_logits(theirs, ids())) <= FP32
    with torch.no_grad():
        weight = ours.transformer.h[0].attn.c_proj.weight
        weight.copy_(weight.t().clone())
    assert gap(gpt2dist_logits(ours, ids()), hf_logits(theirs, ids())) > 1e-2


def test_a_sharded_directory_loads_as_one_file_does_and_a_missing_shard_is_refused(source, tmp_path):
    """save_pretrained shards large models (model.safetensors.index.json): read the same. The control: a shard
    gone is one refusal, before any weight is copied."""
    sharded = tmp_path / "sharded"
    transformers_gpt2(seed=2).save_pretrained(sharded, max_shard_size="60KB")
    shards = sorted(sharded.glob("model-*.safetensors"))
    assert len(shards) > 1 and not (sharded / "model.safetensors").exists()
    whole, split = build_model(TINY, seed=3), build_model(TINY, seed=4)
    load_init(whole, read_source(source, TINY), TINY)
    load_init(split, read_source(sharded, TINY), TINY)
    assert all(torch.equal(a, b) for a, b in zip(whole.state_dict().values(), split.state_dict().values()))
    shards[0].unlink()
    with pytest.raises(UsageError, match="cannot be read as safetensors"):
        read_source(sharded, TINY)


STRATEGY_FAMILIES = [("single", 1), ("fsdp", 2), ("tp", 2), ("pp", 2)]


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("strategy, nproc", STRATEGY_FAMILIES, ids=[s for s, _ in STRATEGY_FAMILIES])
def test_an_exported_run_of_every_strategy_family_is_its_model_in_transformers(strategy, nproc, trained, tmp_path):
    """Any strategy's checkpoint (single's layout) exported and loaded by GPT2LMHeadModel.from_pretrained gives the
    run's own model's logits to 1e-5. The control: the run's starting weights give other logits, so agreement is the
    checkpoint's; and shards without a tokenizer file export none, saying why."""
    run = trained(strategy, nproc=nproc)
    exported = export_run(run, tmp_path / "hf")
    cfg = ModelConfig(**run_record(run)["config"]["model"])
    ours = build_model(cfg, seed=0).eval()
    ours.load_state_dict(final_params(run))
    theirs = from_pretrained(tmp_path / "hf")
    assert gap(gpt2dist_logits(ours, ids()), hf_logits(theirs, ids())) <= FP32
    started = build_model(cfg, seed=run_record(run)["seed"]).eval()
    assert gap(gpt2dist_logits(started, ids()), hf_logits(theirs, ids())) > 1e-2
    assert exported["tokenizer"] is None and "names no tokenizer file" in exported["no_tokenizer"]
    assert json.loads((tmp_path / "hf" / "run.json").read_text()) == run_record(run)
    assert not (tmp_path / "hf" / "tokenizer.json").exists() and exported["strategy"] == strategy


@pytest.mark.slow  # a whole pipeline study first (finished_study)
@pytest.mark.timeout(300)
def test_the_run_a_study_names_to_export_loads_in_transformers(finished_copy, tmp_path):
    """summary.md names, at each placement, the top tier's run that kept its final checkpoint, with the command
    that exports it; run in the study, the command writes what GPT2LMHeadModel.from_pretrained loads: that
    checkpoint's weights, with the study's trained tokenizer. The control: a later repeat kept none, and is refused
    in one line."""
    summary = json.loads((finished_copy / "results" / "summary.json").read_text())
    commands = re.findall(r"`(gpt2dist export --run (\S+) --out \S+)`",
                          (finished_copy / "results" / "summary.md").read_text())
    assert [run for _, run in commands] == [chosen["run_id"] for chosen in summary["export"]]
    assert {run for _, run in commands} == {"single-fp32-n1-r0", "ddp-fp32-n2-r0"}  # one per placement
    for command, run in commands:
        gpt2dist(*shlex.split(command)[1:], cwd=finished_copy)
        model = from_pretrained(finished_copy / f"{run}-hf")
        kept = torch.load(finished_copy / "results" / "runs" / run / "kept" / "checkpoint.pt", weights_only=False)
        assert torch.equal(model.transformer.wte.weight, kept["model"]["transformer.wte.weight"])
        assert AutoTokenizer.from_pretrained(finished_copy / f"{run}-hf")("Hello")["input_ids"]
    refused = gpt2dist("export", "--run", "ddp-fp32-n2-r1", "--out", tmp_path / "hf", cwd=finished_copy, check=False)
    assert refused.returncode == 2 and "has no checkpoint.pt (nor kept/checkpoint.pt)" in refused.stderr
    assert not (tmp_path / "hf").exists()


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> tuple[Path, Path]:
    """Shards tokenized by `gpt2dist prepare` with a trained BPE tokenizer (saved beside them), and a params file of
    the tiny preset that reads them."""
    work = tmp_path_factory.mktemp("prepared")
    for index, text in enumerate(DOCS):
        (work / f"doc{index}.txt").write_text(text)
    data = {"source": {"kind": "files", "paths": [str(work / "doc*.txt")]}, "tokenizer": {"kind": "bpe",
            "vocab_size": 300}, "val_fraction": 0.2}
    prepare(DataConfig(**data), work / "shards", progress=False)
    params = work / "params.yaml"
    params.write_text(yaml.safe_dump({"preset": "tiny", "container": "unused.sif",
                                      "presets": {"tiny": {**TINY_PRESET, "data": data}}}))
    return work / "shards", params


def differing_tensors(left: Path, right: Path) -> list[str]:
    """Names whose tensors differ in a byte (or that one file lacks) between two safetensors files."""
    with safe_open(left, framework="pt") as a, safe_open(right, framework="pt") as b:
        names = set(a.keys()) | set(b.keys())
        common = set(a.keys()) & set(b.keys())
        return sorted(names - common) + sorted(
            name for name in common
            if a.get_tensor(name).dtype != b.get_tensor(name).dtype
            or a.get_tensor(name).numpy().tobytes() != b.get_tensor(name).numpy().tobytes())


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_run_started_from_a_transformers_directory_computes_its_loss_and_exports_its_bytes(source, prepared,
                                                                                            tmp_path):
    """`train --init-from`: the first step's loss is transformers' loss on the same batch (to 1e-5), its record names
    the directory and the sha256 of its weights, and at a learning rate too small to move any weight (the loop trains
    at least one step) the export holds the source's tensors byte for byte, with the run's tokenizer, which
    transformers loads. Controls: the run's own seeded init has another loss, and the byte comparison catches one
    value moved by one ulp."""
    shards, params = prepared
    run = tmp_path / "run"
    gpt2dist(*train_args(shards, params, run, "single", "--init-from", source, "--max-steps", "1",
                         "--set", "train.lr=1.0e-30", "--set", "train.min_lr=0"))
    assert run_record(run)["config"]["init_from"] == {"path": str(source.resolve()),
                                                      "sha256": sha256_file(source / "model.safetensors")}
    t = TINY_PRESET["train"]
    batch = t["global_batch_size"]
    sampler = BatchSampler(open_shards(shards, check_hash=False).train, "train", TINY.n_positions, batch, t["seed"])
    inputs, targets = next(sampler.micro_batches(0, 0, 1, batch))  # step 0's whole global batch
    first = read_metrics(run)[0]["loss"]
    theirs = F.cross_entropy(hf_logits(transformers_gpt2(seed=2), inputs).flatten(0, 1), targets.flatten()).item()
    assert abs(first - theirs) <= FP32 * theirs
    fresh = build_model(TINY, seed=t["seed"]).eval()
    own = F.cross_entropy(gpt2dist_logits(fresh, inputs).flatten(0, 1), targets.flatten()).item()
    assert abs(first - own) > 0.1, (first, own)

    out = tmp_path / "hf"
    code, said, err = invoke("export", "--run", str(run), "--out", str(out))
    said = " ".join(said.split())  # wrapped to the terminal
    assert code == 0 and said.startswith(f"ok: {out}: GPT-2 of ") and said.endswith("tokenizer: byte-level-bpe-300"), err
    assert differing_tensors(source / "model.safetensors", out / "model.safetensors") == []
    with safe_open(out / "model.safetensors", framework="pt") as handle:
        nudged = {name: handle.get_tensor(name) for name in handle.keys()}
    nudged["transformer.h.1.mlp.c_fc.bias"][3] = torch.nextafter(nudged["transformer.h.1.mlp.c_fc.bias"][3],
                                                                 torch.tensor(1.0))
    save_file(nudged, tmp_path / "nudged.safetensors", metadata={"format": "pt"})
    assert differing_tensors(source / "model.safetensors", tmp_path / "nudged.safetensors") == [
        "transformer.h.1.mlp.c_fc.bias"]

    text = "the quick brown fox, 42 times"
    tokenizer = AutoTokenizer.from_pretrained(out, local_files_only=True)
    assert tokenizer(text)["input_ids"] == Tokenizer.from_file(str(shards / "tokenizer.json")).encode(text).ids
    assert tokenizer.eos_token_id == json.loads((shards / "meta.json").read_text())["eos_id"]
    assert json.loads((out / "export.json").read_text())["started_from"] == run_record(run)["config"]["init_from"]


@pytest.mark.parametrize("shape, named", [({"n_embd": 64}, "n_embd 64 (the preset's model: 32)"),
                                          ({"vocab_size": 600}, "vocab_size 600 (the preset's model: 512)")])
def test_weights_of_another_shape_are_refused_before_launch(shape, named, source, shards, params_file, tmp_path):
    """One error line naming the mismatch and the `--set` that fixes it; nothing launched, nothing written. The
    control: the preset's shape is accepted by the same check."""
    other = tmp_path / "other"
    transformers_gpt2(seed=2, **shape).save_pretrained(other)
    run = tmp_path / "run"
    code, out, err = invoke(*map(str, train_args(shards, params_file, run, "single", "--init-from", other)))
    assert code == 2 and err.count("\n") == 1 and err.startswith("error: --init-from ") and named in err, err
    key, value = next(iter(shape.items()))
    assert f"--set model.{key}={value}" in err and not run.exists()
    spec = build_spec(data=shards, out=run, strategy="single", precision="fp32", nproc=1, params=load_params(params_file),
                      preset=None, overrides=[], init_from=source)
    assert spec.init_from.sha256 == sha256_file(source / "model.safetensors") and not run.exists()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_checkpoint_transformers_gpt2_cannot_express_is_refused_and_leaves_no_out(trained, tmp_path):
    """A tensor GPT-2 lacks, or a head untied from the embedding: one error line, and no --out (not even an empty
    one). The control: the same run's own checkpoint exports."""
    run = trained("single")
    code, _, err = invoke("export", "--run", str(run), "--out", str(tmp_path / "fine"))
    assert code == 0 and (tmp_path / "fine" / "model.safetensors").is_file(), err
    payload = torch.load(run / "checkpoint.pt", map_location="cpu", weights_only=False)
    for case, change, named in [("extra", {"transformer.h.0.attn.rotary.weight": torch.zeros(4)}, "besides"),
                                ("untied", {"lm_head.weight": payload["model"]["lm_head.weight"] + 1}, "ties them")]:
        altered = tmp_path / case
        altered.mkdir()
        (altered / "run.json").write_text((run / "run.json").read_text())
        torch.save({**payload, "model": {**payload["model"], **change}}, altered / "checkpoint.pt")
        code, _, err = invoke("export", "--run", str(altered), "--out", str(tmp_path / f"{case}-hf"))
        assert code == 2 and err.count("\n") == 1 and "cannot express" in err and named in err, err
        assert [p.name for p in tmp_path.iterdir() if p.name.startswith((f"{case}-hf", f".{case}-hf"))] == []


PROBE = """
import json, sys
from pathlib import Path
from gpt2dist.config.schema import ModelConfig
from gpt2dist.training import loop  # what every rank imports
from gpt2dist.training.hf_format import load_init, read_source
from gpt2dist.training.model import build_model

cfg = ModelConfig(**json.loads(sys.argv[2]))
load_init(build_model(cfg, seed=0), read_source(Path(sys.argv[1]), cfg), cfg)
print("transformers" in sys.modules)
import transformers  # the control: the probe sees it once it is imported
print("transformers" in sys.modules)
"""


@pytest.mark.timeout(120)
def test_a_rank_loads_transformers_weights_without_importing_transformers(source):
    """A rank's imports and the loader at work leave transformers out (its import costs every rank about 2.5 s);
    the control: the same probe sees it once something imports it."""
    done = subprocess.run([sys.executable, "-c", PROBE, str(source), TINY.model_dump_json()], capture_output=True,
                          text=True, timeout=110)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["False", "True"]
