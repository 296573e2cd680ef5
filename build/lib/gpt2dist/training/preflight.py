"""Checks made once in the launching process, before any rank starts, so that bad input
fails with one line instead of one traceback per rank."""

from __future__ import annotations

from pathlib import Path

from gpt2dist.config.schema import RunSpec
from gpt2dist.config.strategies import extras_needed
from gpt2dist.data.shards import verify_shards
from gpt2dist.errors import UsageError
from gpt2dist.training.optional import require


def check_dependencies(spec: RunSpec) -> None:
    """Every optional dependency the run's strategy and precision need imports here."""
    for extra in extras_needed(spec.strategy, spec.precision):
        require(extra)


def check_data(spec: RunSpec) -> dict:
    """Verify sizes and sha256 of every shard and that the model can embed the vocabulary."""
    meta = verify_shards(Path(spec.data_dir), check_hash=True)
    check_vocabulary(meta, spec)
    return meta


def check_vocabulary(meta: dict, spec: RunSpec) -> None:
    """The model must embed every token id of the data. Ranks check again: a worker started
    by a printed multi-node command never passes through this launcher."""
    if meta["vocab_size"] > spec.model.vocab_size:
        raise UsageError(
            f"the data's vocabulary ({meta['vocab_size']}) exceeds model.vocab_size "
            f"({spec.model.vocab_size}); raise model.vocab_size (e.g. --set model.vocab_size={meta['vocab_size']})"
        )
