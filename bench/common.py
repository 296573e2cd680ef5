"""Benchmark helpers: throwaway shards and a real single-process Trainer built from a preset."""

from __future__ import annotations

import statistics
import tempfile
from pathlib import Path

import numpy as np

from gpt2dist.data.shards import write_shards
from gpt2dist.launch.runner import build_spec
from gpt2dist.training.loop import Trainer
from gpt2dist.training.strategies import REGISTRY

REPO = Path(__file__).resolve().parents[1]


def random_shards(vocab: int, tokens: int = 2_000_000) -> Path:
    """Uniform random tokens: throughput does not depend on what the text says."""
    directory = Path(tempfile.mkdtemp(prefix="gpt2dist-bench-"))
    rng = np.random.default_rng(0)
    write_shards(directory, {"train": [rng.integers(0, vocab, tokens)], "val": [rng.integers(0, vocab, tokens // 10)]},
                 vocab_size=vocab, eos_id=vocab - 1, tokenizer={"name": "random"}, source={"name": "random"})
    return directory


def single_trainer(preset: str, precision: str, overrides: list[str]) -> Trainer:
    from gpt2dist.config import load_preset

    vocab = load_preset(REPO / "params.yaml", preset, overrides).model.vocab_size
    data = random_shards(vocab)
    spec = build_spec(data=data, out=data / "run", strategy="single", precision=precision, nproc=1,
                      params=REPO / "params.yaml", preset=preset, overrides=overrides)
    return Trainer(spec, REGISTRY["single"](spec))


def median(values: list[float]) -> float:
    return statistics.median(values)
