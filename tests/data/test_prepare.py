"""`gpt2dist prepare` and `verify`: sources, tokenizers, exact reproducibility, bad input."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from tokenizers import Tokenizer

from gpt2dist.config.schema import DataConfig
from gpt2dist.data.corpus import documents
from gpt2dist.data.encoding import GPT2Encoder, gpt2_tiktoken
from gpt2dist.data.shards import verify_shards
from gpt2dist.data.tokenizer import GPT2_FILES, default_gpt2_dir, gpt2_from_files

from conftest import TINY_PRESET, gpt2dist, require

DOCS = [f"Document {i}: the quick brown fox jumps over the lazy dog {i} times.\nSecond line {i * 7}." for i in range(60)]
GPT2_DIR = default_gpt2_dir()


@pytest.fixture
def gpt2_files() -> Path:
    """GPT-2's tokenizer files, as setup fetches them (a skip naming the script where they are missing)."""
    missing = [name for name in GPT2_FILES if not (GPT2_DIR / name).is_file()]
    require("GPT2DIST_REQUIRE_TOKENIZER", missing=missing and f"GPT-2 tokenizer files {missing} not in {GPT2_DIR}; "
            "run containers/fetch_gpt2_tokenizer.sh")
    return GPT2_DIR


def params_with(tmp_path: Path, data: dict) -> Path:
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump({"preset": "t", "container": "unused.sif", "presets": {"t": {**TINY_PRESET, "data": data}}}))
    return path


def prepare(tmp_path, data, out="shards", check=True, **kw):
    return gpt2dist("prepare", "--out", tmp_path / out, "--params", params_with(tmp_path, data), "--no-progress",
                    check=check, cwd=tmp_path, **kw)


def decode_documents(directory: Path, split: str) -> list[str]:
    meta = json.loads((directory / "meta.json").read_text())
    tokenizer = Tokenizer.from_file(str(directory / meta["tokenizer"]["file"]))
    ids = np.fromfile(directory / f"{split}.bin", dtype="<u2").tolist()
    docs, current = [], []
    for token in ids + [meta["eos_id"]]:
        if token == meta["eos_id"]:
            docs.append(tokenizer.decode(current, skip_special_tokens=False))
            current = []
        else:
            current.append(token)
    return docs


def split_of(data: dict) -> dict[str, list[str]]:
    out = {"train": [], "val": []}
    for split, text in documents(DataConfig.model_validate(data)):
        out[split].append(text)
    return out


BPE = {"kind": "bpe", "vocab_size": 300}


def test_local_txt_jsonl_parquet_round_trip(tmp_path):
    (tmp_path / "corpus").mkdir()
    for i, doc in enumerate(DOCS[:20]):
        (tmp_path / "corpus" / f"a{i:02d}.txt").write_text(doc)
    with open(tmp_path / "corpus" / "b.jsonl", "w") as handle:
        for doc in DOCS[20:40]:
            handle.write(json.dumps({"body": doc}) + "\n")
    pq.write_table(pa.table({"body": DOCS[40:]}), tmp_path / "corpus" / "c.parquet")
    data = {"source": {"kind": "files", "paths": ["corpus/*.txt", "corpus/*.jsonl", "corpus/*.parquet"],
                       "text_field": "body"}, "tokenizer": BPE, "val_fraction": 0.2}
    result = prepare(tmp_path, data)
    assert result.stdout.startswith("ok: ") and "sha256 written" in result.stdout
    os.chdir(tmp_path)  # the globs are relative to the working directory
    expected = split_of(data)
    assert len(expected["train"]) + len(expected["val"]) == 60 and expected["val"]
    for split in ("train", "val"):
        assert decode_documents(tmp_path / "shards", split) == expected[split]


@pytest.mark.slow  # parses the standard library twice, seconds each
def test_embedded_corpus_is_reproducible_byte_for_byte(tmp_path):
    data = {"source": {"kind": "embedded", "min_chars": 2500}, "tokenizer": BPE, "val_fraction": 0.15}
    prepare(tmp_path, data, out="a")
    prepare(tmp_path, data, out="b")
    for name in ("train.bin", "val.bin", "tokenizer.json", "meta.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    meta = json.loads((tmp_path / "a" / "meta.json").read_text())
    assert meta["source"]["kind"] == "embedded" and len(meta["source"]["fingerprint"]) == 64
    assert meta["tokenizer"]["vocab_size"] <= 300 and meta["splits"]["val"]["tokens"] > 0
    assert decode_documents(tmp_path / "a", "val") == split_of(data)["val"]


def test_datasets_code_path_on_a_local_directory(tmp_path):
    (tmp_path / "ds").mkdir()
    for split, docs in (("train", DOCS[:50]), ("validation", DOCS[50:])):
        with open(tmp_path / "ds" / f"{split}.jsonl", "w") as handle:
            handle.writelines(json.dumps({"text": d}) + "\n" for d in docs)
    data = {"source": {"kind": "hf", "name": str(tmp_path / "ds")}, "tokenizer": BPE}
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    prepare(tmp_path, data, env=env)
    assert decode_documents(tmp_path / "shards", "train") == DOCS[:50]
    assert decode_documents(tmp_path / "shards", "val") == DOCS[50:]


@pytest.mark.slow  # encodes a corpus twice
def test_gpt2_vocabulary_matches_tiktoken(gpt2_files):
    """The saved tokenizer (used to decode) and the tiktoken encoder (used to write) agree."""
    loaded = gpt2_from_files(GPT2_DIR)
    assert loaded.tokenizer.encode("Hello world").ids == [15496, 995] and loaded.eos_id == 50256
    reference = gpt2_tiktoken(GPT2_DIR / "encoder.json", GPT2_DIR / "vocab.bpe")
    texts = [doc for _, doc in documents(DataConfig.model_validate(
        {"source": {"kind": "embedded", "min_chars": 1500}, "tokenizer": {"kind": "gpt2"}}))]
    assert sum(map(len, texts)) > 100_000
    written = [ids.tolist() for batch in GPT2Encoder(GPT2_DIR / "encoder.json", GPT2_DIR / "vocab.bpe", workers=2)
               .encode(iter([texts[:40], texts[40:]])) for ids in batch]
    assert written == [e.ids for e in loaded.tokenizer.encode_batch(texts)] == reference.encode_ordinary_batch(texts)


def test_prepare_with_gpt2_files(gpt2_files, tmp_path):
    (tmp_path / "c.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in DOCS))
    data = {"source": {"kind": "files", "paths": ["c.jsonl"]}, "tokenizer": {"kind": "gpt2", "path": str(GPT2_DIR)},
            "val_fraction": 0.2}
    prepare(tmp_path, data)
    meta = verify_shards(tmp_path / "shards")
    assert meta["vocab_size"] == 50257 and meta["eos_id"] == 50256
    assert meta["tokenizer"]["files"]["vocab.bpe"] == "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5"
    os.chdir(tmp_path)
    assert decode_documents(tmp_path / "shards", "train") == split_of(data)["train"]


def test_verify_reports_and_catches_a_flipped_byte(tmp_path):
    (tmp_path / "c.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in DOCS))
    prepare(tmp_path, {"source": {"kind": "files", "paths": ["c.jsonl"]}, "tokenizer": BPE, "val_fraction": 0.2})
    ok = gpt2dist("verify", tmp_path / "shards")
    assert ok.stdout.startswith("ok: ") and "sha256 verified" in ok.stdout
    data = bytearray((tmp_path / "shards" / "val.bin").read_bytes())
    data[3] ^= 0x10
    (tmp_path / "shards" / "val.bin").write_bytes(bytes(data))
    bad = gpt2dist("verify", tmp_path / "shards", check=False)
    assert bad.returncode == 2 and bad.stderr.strip().splitlines() == [
        f"error: shard {tmp_path / 'shards' / 'val.bin'} is corrupt: its sha256 differs from meta.json; "
        "re-run `gpt2dist prepare`"]


@pytest.mark.slow  # a prepare killed part-way
def test_interrupted_prepare_leaves_no_final_file(tmp_path):
    rng = np.random.default_rng(0)
    words = np.array(["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa"])
    with open(tmp_path / "big.jsonl", "w") as handle:  # ~40 MB: encoding takes seconds
        for _ in range(20_000):
            handle.write(json.dumps({"text": " ".join(rng.choice(words, 400))}) + "\n")
    data = {"source": {"kind": "files", "paths": ["big.jsonl"]}, "tokenizer": BPE, "batch_documents": 256}
    proc = subprocess.Popen([sys.executable, "-m", "gpt2dist", "prepare", "--out", str(tmp_path / "shards"),
                             "--params", str(params_with(tmp_path, data)), "--no-progress"],
                            cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    shards, deadline = tmp_path / "shards", time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:  # kill while shards are being written
        if shards.exists() and any(p.name.endswith(".tmp") for p in shards.iterdir()):
            break
        time.sleep(0.01)
    assert proc.poll() is None, "prepare finished before it could be interrupted"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    names = {p.name for p in shards.iterdir()}
    assert any(name.endswith(".tmp") for name in names)  # it was killed mid-write ...
    assert not {"train.bin", "val.bin", "meta.json", "tokenizer.json"} & names  # ... and nothing looks complete


def test_failure_midway_cleans_up(tmp_path):
    lines = [json.dumps({"text": d}) for d in DOCS] + ['{"other": 1}']
    (tmp_path / "c.jsonl").write_text("\n".join(lines) + "\n")
    result = prepare(tmp_path, {"source": {"kind": "files", "paths": ["c.jsonl"]}, "tokenizer": BPE,
                                "batch_documents": 8}, check=False)
    assert result.returncode == 2 and "c.jsonl:61 has no field 'text'" in result.stderr
    assert not (tmp_path / "shards").exists() or not any((tmp_path / "shards").iterdir())


@pytest.mark.parametrize(
    "case, fragment",
    [
        ("missing-files", "no files match data.source.paths ['nothing/*.txt']"),
        ("empty-corpus", "the corpus is empty"),
        ("unknown-dataset", "could not load dataset 'no-such-org/no-such-dataset'"),
        ("hub-tokenizer-offline", "could not fetch the 'gpt2' tokenizer from the hub"),
        ("unpinned-hub-dataset", "needs a pinned data.source.revision"),
    ],
)
def test_bad_sources_fail_with_one_line(case, fragment, tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"),
           "GPT2DIST_GPT2_TOKENIZER_DIR": str(tmp_path / "no-gpt2-here")}
    (tmp_path / "blank.txt").write_text("   \n\n")
    data = {
        "missing-files": {"source": {"kind": "files", "paths": ["nothing/*.txt"]}, "tokenizer": BPE},
        "empty-corpus": {"source": {"kind": "files", "paths": ["blank.txt"]}, "tokenizer": BPE},
        "unknown-dataset": {"source": {"kind": "hf", "name": "no-such-org/no-such-dataset", "revision": "main"},
                            "tokenizer": BPE},
        "hub-tokenizer-offline": {"source": {"kind": "files", "paths": ["blank.txt"]}, "tokenizer": {"kind": "gpt2"}},
        "unpinned-hub-dataset": {"source": {"kind": "hf", "name": "Salesforce/wikitext"}, "tokenizer": BPE},
    }[case]
    result = prepare(tmp_path, data, check=False, env=env)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and fragment in lines[0], result.stderr
    if case in ("unknown-dataset", "hub-tokenizer-offline"):
        assert "local files" in lines[0] or "data.tokenizer.path" in lines[0]
    assert not (tmp_path / "shards" / "meta.json").exists()
