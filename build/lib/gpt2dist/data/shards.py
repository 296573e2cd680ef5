"""Token shards in the gpt2dist-tokens-v1 format: write, verify, memory-map.

A directory holds `train.bin` and `val.bin` (flat little-endian uint16 token ids) and
`meta.json`, written last so that its presence means the shards are complete.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import numpy as np

from gpt2dist.errors import UsageError
from gpt2dist.io import atomic_open, atomic_write_json

FORMAT = "gpt2dist-tokens-v1"
SPLITS = ("train", "val")
TOKEN_DTYPE = np.dtype("<u2")
MAX_VOCAB = int(np.iinfo(TOKEN_DTYPE).max) + 1


def sha256_file(path: Path, chunk_bytes: int = 1 << 22) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk_bytes):
            digest.update(block)
    return digest.hexdigest()


class ShardWriter:
    """Streams token ids into both splits at once, then writes meta.json last.

    Shards live under temporary names until `finish`; leaving the `with` block by an
    exception (or a kill) leaves no file under a final name.
    """

    def __init__(self, out_dir: Path, *, vocab_size: int):
        if vocab_size > MAX_VOCAB:
            raise UsageError(f"vocabulary of {vocab_size} does not fit uint16 shards (at most {MAX_VOCAB} ids)")
        self.out_dir, self.vocab_size = Path(out_dir), vocab_size
        self._stack = contextlib.ExitStack()
        self._handles: dict[str, IO[bytes]] = {}
        self._digests = {name: hashlib.sha256() for name in SPLITS}
        self.tokens = dict.fromkeys(SPLITS, 0)

    def __enter__(self) -> ShardWriter:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        (self.out_dir / "meta.json").unlink(missing_ok=True)  # the old meta must not vouch for new shards
        for name in SPLITS:
            self._handles[name] = self._stack.enter_context(atomic_open(self.out_dir / f"{name}.bin", "wb"))
        return self

    def append(self, split: str, ids: np.ndarray | list[int]) -> None:
        data = np.asarray(ids, dtype=TOKEN_DTYPE).tobytes()
        self._handles[split].write(data)
        self._digests[split].update(data)
        self.tokens[split] += len(data) // TOKEN_DTYPE.itemsize

    def finish(self, *, eos_id: int, tokenizer: dict, source: dict) -> dict:
        """Move the shards to their final names and write meta.json. Returns the meta dict."""
        self._stack.close()
        meta = {
            "format": FORMAT,
            "dtype": "uint16",
            "vocab_size": int(self.vocab_size),
            "eos_id": int(eos_id),
            "tokenizer": tokenizer,
            "source": source,
            "splits": {
                name: {"file": f"{name}.bin", "tokens": self.tokens[name], "sha256": self._digests[name].hexdigest()}
                for name in SPLITS
            },
        }
        atomic_write_json(self.out_dir / "meta.json", meta)
        return meta

    def __exit__(self, *exc_info) -> None:
        self._stack.__exit__(*exc_info)  # on error: the temporary files are deleted


def write_shards(
    out_dir: Path,
    splits: dict[str, Iterable[np.ndarray | list[int]]],
    *,
    vocab_size: int,
    eos_id: int,
    tokenizer: dict,
    source: dict,
) -> dict:
    """Write ready token chunks per split (tests and benchmarks; `prepare` streams instead)."""
    if set(splits) != set(SPLITS):
        raise UsageError(f"shards need exactly the splits {SPLITS}, got {sorted(splits)}")
    with ShardWriter(out_dir, vocab_size=vocab_size) as writer:
        for name in SPLITS:
            for chunk in splits[name]:
                writer.append(name, chunk)
        return writer.finish(eos_id=eos_id, tokenizer=tokenizer, source=source)


def read_meta(data_dir: Path) -> dict:
    path = Path(data_dir) / "meta.json"
    try:
        meta = json.loads(path.read_text())
    except FileNotFoundError:
        raise UsageError(f"no token shards in {data_dir}: {path.name} is missing (run `gpt2dist prepare`)") from None
    except json.JSONDecodeError as exc:
        raise UsageError(f"{path} is not valid JSON ({exc}); re-run `gpt2dist prepare`") from None
    if meta.get("format") != FORMAT or meta.get("dtype") != "uint16":
        raise UsageError(f"{path} is not a {FORMAT} uint16 shard description; re-run `gpt2dist prepare`")
    return meta


def verify_shards(data_dir: Path, *, check_hash: bool = True) -> dict:
    """Check every split's size (and sha256) against meta.json. Returns the meta dict."""
    data_dir = Path(data_dir)
    meta = read_meta(data_dir)
    for name in SPLITS:
        entry = meta["splits"].get(name)
        if entry is None:
            raise UsageError(f"{data_dir}/meta.json lists no '{name}' split; re-run `gpt2dist prepare`")
        path = data_dir / entry["file"]
        if not path.is_file():
            raise UsageError(f"shard {path} is missing; re-run `gpt2dist prepare`")
        expected = entry["tokens"] * TOKEN_DTYPE.itemsize
        if path.stat().st_size != expected:
            raise UsageError(
                f"shard {path} has {path.stat().st_size} bytes, meta.json says {expected}; re-run `gpt2dist prepare`"
            )
        if check_hash and sha256_file(path) != entry["sha256"]:
            raise UsageError(f"shard {path} is corrupt: its sha256 differs from meta.json; re-run `gpt2dist prepare`")
    return meta


@dataclass(frozen=True)
class Shards:
    meta: dict
    train: np.ndarray
    val: np.ndarray


def open_shards(data_dir: Path, *, check_hash: bool) -> Shards:
    """Memory-map both splits after verifying them."""
    meta = verify_shards(data_dir, check_hash=check_hash)
    maps = {
        name: np.memmap(Path(data_dir) / meta["splits"][name]["file"], dtype=TOKEN_DTYPE, mode="r")
        for name in SPLITS
    }
    return Shards(meta=meta, train=maps["train"], val=maps["val"])
