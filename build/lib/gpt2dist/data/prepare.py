"""`gpt2dist prepare`: text corpus -> train.bin, val.bin, tokenizer.json, meta.json.

Streams documents in batches (memory stays bounded for corpora larger than RAM), encodes
them on all cores (encoding.py), joins documents of a split with the EOS id between them, and
writes shards under temporary names until they are complete. The output depends only on
the data config and the source text, so re-running gives byte-identical files.
"""

from __future__ import annotations

import collections
import hashlib
import itertools
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from tqdm import tqdm

from gpt2dist.config.schema import DataConfig
from gpt2dist.data.corpus import Document, describe_source, documents
from gpt2dist.data.shards import SPLITS, ShardWriter, sha256_file
from gpt2dist.data.tokenizer import load_tokenizer
from gpt2dist.errors import UsageError
from gpt2dist.io import atomic_write_text


def _batches(stream: Iterator[Document], size: int) -> Iterator[list[Document]]:
    while batch := list(itertools.islice(stream, size)):
        yield batch


def prepare(cfg: DataConfig, out_dir: Path, *, progress: bool = True) -> dict:
    out_dir = Path(out_dir)
    loaded = load_tokenizer(cfg.tokenizer, (text for split, text in documents(cfg) if split == "train"))
    eos = np.array([loaded.eos_id], dtype=np.uint16)
    content = hashlib.sha256()  # fingerprint of exactly the text that was tokenized, split by split
    docs = dict.fromkeys(SPLITS, 0)
    chars = 0
    in_flight: collections.deque[list[Document]] = collections.deque()

    def texts() -> Iterator[list[str]]:
        for batch in _batches(documents(cfg), cfg.batch_documents):
            in_flight.append(batch)
            yield [text for _, text in batch]

    with ShardWriter(out_dir, vocab_size=loaded.tokenizer.get_vocab_size()) as writer:
        bar = tqdm(desc="tokenize", unit="char", unit_scale=True, disable=not progress)
        for encoded in loaded.encoder.encode(texts()):
            pieces: dict[str, list[np.ndarray]] = {name: [] for name in SPLITS}
            for (split, text), ids in zip(in_flight.popleft(), encoded):
                if docs[split]:
                    pieces[split].append(eos)  # EOS between documents of a split
                pieces[split].append(ids)
                docs[split] += 1
                content.update(f"{split}\0{len(text)}\0".encode() + text.encode())
                chars += len(text)
                bar.update(len(text))
            for split, arrays in pieces.items():
                if arrays:
                    writer.append(split, np.concatenate(arrays))
        bar.close()
        if not sum(docs.values()):
            raise UsageError(f"the corpus is empty: data.source {cfg.source.kind} yielded no documents")
        for split in SPLITS:
            if not docs[split]:
                raise UsageError(f"no document went to the '{split}' split ({docs} documents); "
                                 "add documents or raise data.val_fraction")
        tokenizer_path = out_dir / "tokenizer.json"
        atomic_write_text(tokenizer_path, loaded.tokenizer.to_str())
        description = {**loaded.description, "vocab_size": loaded.tokenizer.get_vocab_size(), "eos": loaded.eos_id,
                       "file": tokenizer_path.name, "sha256": sha256_file(tokenizer_path)}
        source = {**describe_source(cfg), "fingerprint": content.hexdigest(), "documents": docs, "characters": chars}
        return writer.finish(eos_id=loaded.eos_id, tokenizer=description, source=source)
