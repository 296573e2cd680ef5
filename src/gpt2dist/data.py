"""Token shards in the gpt2dist-tokens-v1 format: write, verify, and deal out batches per rank.

A directory holds `train.bin` and `val.bin` (flat little-endian uint16 token ids) and
`meta.json`, written last so that its presence means the shards are complete.

Batches are a pure function of (seed, split, step): the global batch of a step is the
same for every strategy and world size, and each rank takes a disjoint contiguous slice
of it. That is what makes loss curves comparable across strategies, and it makes resuming
trivial: the data position is the step number.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from gpt2dist.errors import UsageError
from gpt2dist.io import atomic_open, atomic_write_json

FORMAT = "gpt2dist-tokens-v1"
SPLITS = ("train", "val")
TOKEN_DTYPE = np.dtype("<u2")
MAX_VOCAB = int(np.iinfo(TOKEN_DTYPE).max) + 1
_STREAM = {"train": 0, "val": 1}


def sha256_file(path: Path, chunk_bytes: int = 1 << 22) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk_bytes):
            digest.update(block)
    return digest.hexdigest()


def _write_split(path: Path, chunks: Iterable[np.ndarray | list[int]]) -> dict:
    """Stream token chunks to `path` without holding the whole split in memory."""
    digest, count = hashlib.sha256(), 0
    with atomic_open(path, "wb") as handle:
        for chunk in chunks:
            data = np.asarray(chunk, dtype=TOKEN_DTYPE).tobytes()
            handle.write(data)
            digest.update(data)
            count += len(data) // TOKEN_DTYPE.itemsize
    return {"file": path.name, "tokens": count, "sha256": digest.hexdigest()}


def write_shards(
    out_dir: Path,
    splits: dict[str, Iterable[np.ndarray | list[int]]],
    *,
    vocab_size: int,
    eos_id: int,
    tokenizer: dict,
    source: dict,
) -> dict:
    """Write train.bin, val.bin and, last, meta.json. Returns the meta dict."""
    if vocab_size > MAX_VOCAB:
        raise UsageError(f"vocabulary of {vocab_size} does not fit uint16 shards (at most {MAX_VOCAB} ids)")
    if set(splits) != set(SPLITS):
        raise UsageError(f"shards need exactly the splits {SPLITS}, got {sorted(splits)}")
    out_dir = Path(out_dir)
    (out_dir / "meta.json").unlink(missing_ok=True)  # the old meta must not vouch for new shards
    meta = {
        "format": FORMAT,
        "dtype": "uint16",
        "vocab_size": int(vocab_size),
        "eos_id": int(eos_id),
        "tokenizer": tokenizer,
        "source": source,
        "splits": {name: _write_split(out_dir / f"{name}.bin", splits[name]) for name in SPLITS},
    }
    atomic_write_json(out_dir / "meta.json", meta)
    return meta


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


class BatchSampler:
    """Deals out the rows of each global batch: rank r of w gets rows [r*B/w, (r+1)*B/w)."""

    def __init__(self, tokens: np.ndarray, split: str, context: int, global_batch: int, seed: int):
        if len(tokens) < context + 2:
            raise UsageError(
                f"the '{split}' split has {len(tokens)} tokens, fewer than one sequence of "
                f"{context + 1}; prepare more data or lower model.n_positions"
            )
        self.tokens, self.split, self.context = tokens, split, context
        self.global_batch, self.seed = global_batch, seed

    def offsets(self, step: int) -> np.ndarray:
        rng = np.random.default_rng([self.seed, _STREAM[self.split], step])
        return rng.integers(0, len(self.tokens) - self.context - 1, size=self.global_batch)

    def micro_batches(
        self, step: int, rank: int, world_size: int, rows_per_micro: int
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """(inputs, targets) int64 tensors of shape [rows_per_micro, context], this rank's share."""
        per_rank = self.global_batch // world_size
        mine = self.offsets(step)[rank * per_rank : (rank + 1) * per_rank]
        span = self.context + 1
        for start in range(0, per_rank, rows_per_micro):
            rows = np.stack([self.tokens[o : o + span] for o in mine[start : start + rows_per_micro]])
            batch = torch.from_numpy(rows.astype(np.int64))
            yield batch[:, :-1], batch[:, 1:]
