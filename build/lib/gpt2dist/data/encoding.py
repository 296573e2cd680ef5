"""Batch encoders for `prepare`: turn batches of documents into uint16 id arrays on all cores.

GPT-2's vocabulary is encoded with tiktoken built from the same encoder.json/vocab.bpe
(the ids equal those of the GPT-2 BPE in `tokenizers`; tests check it) in one worker
process per core: a process pool scales where tiktoken's own thread batching does not.
At most two batches per worker are in flight, so memory stays bounded however large the
corpus. A trained BPE is encoded by `tokenizers`' batched encode, which is parallel itself.
"""

from __future__ import annotations

import collections
import multiprocessing
import os
from collections.abc import Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from pathlib import Path

import numpy as np

GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
EOS = "<|endoftext|>"


def gpt2_tiktoken(encoder_json: Path, vocab_bpe: Path):
    """tiktoken's Encoding for GPT-2, from the files rather than tiktoken's own download."""
    import tiktoken
    from tiktoken.load import data_gym_to_mergeable_bpe_ranks

    ranks = data_gym_to_mergeable_bpe_ranks(str(vocab_bpe), str(encoder_json))
    return tiktoken.Encoding(name="gpt2-files", pat_str=GPT2_PATTERN, mergeable_ranks=ranks,
                             special_tokens={EOS: len(ranks)})


_WORKER_ENCODING = None


def _start_worker(encoder_json: Path, vocab_bpe: Path) -> None:
    global _WORKER_ENCODING
    _WORKER_ENCODING = gpt2_tiktoken(encoder_json, vocab_bpe)


def _encode_in_worker(texts: list[str]) -> list[np.ndarray]:
    return [np.asarray(_WORKER_ENCODING.encode_ordinary(text), dtype=np.uint16) for text in texts]


def available_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


class GPT2Encoder:
    def __init__(self, encoder_json: Path, vocab_bpe: Path, workers: int | None = None):
        self.workers = workers or available_cores()
        self.files = (encoder_json, vocab_bpe)

    def encode(self, batches: Iterator[list[str]]) -> Iterator[list[np.ndarray]]:
        """Encoded batches in input order."""
        if self.workers == 1:
            _start_worker(*self.files)
            yield from map(_encode_in_worker, batches)
            return
        context = multiprocessing.get_context("spawn")  # the parent may hold threads; fork is unsafe then
        with ProcessPoolExecutor(self.workers, mp_context=context, initializer=_start_worker,
                                 initargs=self.files) as pool:
            pending: collections.deque[Future] = collections.deque()
            for batch in batches:
                pending.append(pool.submit(_encode_in_worker, batch))
                if len(pending) >= 2 * self.workers:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()


class TokenizersEncoder:
    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def encode(self, batches: Iterator[list[str]]) -> Iterator[list[np.ndarray]]:
        for batch in batches:
            encoded = self.tokenizer.encode_batch_fast(batch, add_special_tokens=False)
            yield [np.asarray(e.ids, dtype=np.uint16) for e in encoded]
