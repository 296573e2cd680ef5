"""`gpt2dist prepare`: text corpus -> train.bin, val.bin, tokenizer.json, meta.json.

Streams documents in batches (memory stays bounded for corpora larger than RAM), encodes
each batch on all cores, joins documents of a split with the EOS id between them, and
writes shards under temporary names until they are complete. The output depends only on
the data config and the source text, so re-running gives byte-identical files.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from tqdm import tqdm

from gpt2dist.config import DataConfig
from gpt2dist.corpus import Document, describe_source, documents
from gpt2dist.data import SPLITS, ShardWriter, sha256_file
from gpt2dist.errors import UsageError
from gpt2dist.io import atomic_write_text
from gpt2dist.tokenizer import load_tokenizer


def _batches(stream: Iterator[Document], size: int) -> Iterator[list[Document]]:
    while batch := list(itertools.islice(stream, size)):
        yield batch


def prepare(cfg: DataConfig, out_dir: Path, *, progress: bool = True) -> dict:
    out_dir = Path(out_dir)
    loaded = load_tokenizer(cfg.tokenizer, (text for split, text in documents(cfg) if split == "train"))
    tokenizer, eos = loaded.tokenizer, loaded.eos_id
    content = hashlib.sha256()  # fingerprint of exactly the text that was tokenized, split by split
    docs = dict.fromkeys(SPLITS, 0)
    chars = 0
    with ShardWriter(out_dir, vocab_size=tokenizer.get_vocab_size()) as writer:
        bar = tqdm(desc="tokenize", unit="char", unit_scale=True, disable=not progress)
        for batch in _batches(documents(cfg), cfg.batch_documents):
            encoded = tokenizer.encode_batch_fast([text for _, text in batch], add_special_tokens=False)
            pieces: dict[str, list[list[int]]] = {name: [] for name in SPLITS}
            for (split, text), encoding in zip(batch, encoded):
                if docs[split]:
                    pieces[split].append([eos])
                pieces[split].append(encoding.ids)
                docs[split] += 1
                content.update(f"{split}\0{len(text)}\0".encode() + text.encode())
                chars += len(text)
            for split, ids in pieces.items():
                if ids:
                    writer.append(split, np.fromiter(itertools.chain.from_iterable(ids), dtype=np.uint16))
            bar.update(sum(len(text) for _, text in batch))
        bar.close()
        if not sum(docs.values()):
            raise UsageError(f"the corpus is empty: data.source {cfg.source.kind} yielded no documents")
        for split in SPLITS:
            if not docs[split]:
                raise UsageError(f"no document went to the '{split}' split ({docs} documents); "
                                 "add documents or raise data.val_fraction")
        tokenizer_path = out_dir / "tokenizer.json"
        atomic_write_text(tokenizer_path, tokenizer.to_str())
        description = {**loaded.description, "vocab_size": tokenizer.get_vocab_size(), "eos": eos,
                       "file": tokenizer_path.name, "sha256": sha256_file(tokenizer_path)}
        source = {**describe_source(cfg), "fingerprint": content.hexdigest(), "documents": docs, "characters": chars}
        return writer.finish(eos_id=eos, tokenizer=description, source=source)
