"""Token shards: the gpt2dist-tokens-v1 contract and its verification."""

import json

import numpy as np
import pytest

from gpt2dist.data.shards import open_shards, verify_shards, write_shards
from gpt2dist.errors import UsageError

from conftest import make_shards


def test_meta_matches_contract(tmp_path):
    make_shards(tmp_path, vocab=300, train_tokens=1000, val_tokens=200)
    meta = json.loads((tmp_path / "meta.json").read_text())
    assert meta["format"] == "gpt2dist-tokens-v1" and meta["dtype"] == "uint16"
    assert meta["vocab_size"] == 300 and meta["splits"]["train"]["tokens"] == 1000
    assert (tmp_path / "train.bin").stat().st_size == 2000
    raw = np.fromfile(tmp_path / "val.bin", dtype="<u2")
    assert len(raw) == 200 and raw.max() < 300


def test_streamed_chunks_concatenate(tmp_path):
    write_shards(tmp_path, {"train": [[1, 2], np.array([3, 4, 5])], "val": [[6, 7, 8]]},
                 vocab_size=10, eos_id=0, tokenizer={}, source={})
    shards = open_shards(tmp_path, check_hash=True)
    assert shards.train.tolist() == [1, 2, 3, 4, 5] and shards.val.tolist() == [6, 7, 8]


def test_flipped_byte_fails_verification(tmp_path):
    make_shards(tmp_path, train_tokens=1000, val_tokens=200)
    with open(tmp_path / "train.bin", "r+b") as handle:
        handle.seek(100)
        byte = handle.read(1)
        handle.seek(100)
        handle.write(bytes([byte[0] ^ 0xFF]))
    verify_shards(tmp_path, check_hash=False)  # same size: only the hash can tell
    with pytest.raises(UsageError, match=r"train.bin is corrupt: its sha256 differs from meta.json"):
        verify_shards(tmp_path)


def test_truncated_and_missing_shards(tmp_path):
    make_shards(tmp_path, train_tokens=1000, val_tokens=200)
    with open(tmp_path / "val.bin", "r+b") as handle:
        handle.truncate(100)
    with pytest.raises(UsageError, match="val.bin has 100 bytes, meta.json says 400"):
        verify_shards(tmp_path, check_hash=False)
    (tmp_path / "val.bin").unlink()
    with pytest.raises(UsageError, match="val.bin is missing"):
        verify_shards(tmp_path)
    (tmp_path / "meta.json").unlink()
    with pytest.raises(UsageError, match="meta.json is missing"):
        verify_shards(tmp_path)


def test_vocabulary_must_fit_uint16(tmp_path):
    with pytest.raises(UsageError, match="does not fit uint16"):
        write_shards(tmp_path, {"train": [[1]], "val": [[1]]}, vocab_size=70_000, eos_id=0, tokenizer={}, source={})
    assert not any(tmp_path.iterdir())
