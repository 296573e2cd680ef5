"""Tokenizers for `gpt2dist prepare`: a `tokenizers.Tokenizer` saved beside the shards for
decoding, and the batch encoder that writes them (see encoding.py).

gpt2: GPT-2's byte-level BPE (50257 ids, <|endoftext|> = 50256), from a directory holding
encoder.json and vocab.bpe; with no directory set, from the fetch script's cache when it
holds them, else from the hub's `gpt2`.
bpe: a byte-level BPE trained on the training split at a configured vocabulary size, for
CPU-scale presets where a 50257-row embedding would dominate the model.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from gpt2dist.config.schema import TokenizerConfig
from gpt2dist.data.encoding import EOS, GPT2Encoder, TokenizersEncoder
from gpt2dist.data.shards import sha256_file
from gpt2dist.errors import UsageError

GPT2_FILES = ("encoder.json", "vocab.bpe")
FETCH_HINT = "containers/fetch_gpt2_tokenizer.sh downloads them"


def default_gpt2_dir() -> Path:
    """Where the fetch script puts GPT-2's files (override: GPT2DIST_GPT2_TOKENIZER_DIR)."""
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return Path(os.environ.get("GPT2DIST_GPT2_TOKENIZER_DIR", cache / "gpt2dist" / "gpt2-tokenizer"))


@dataclass(frozen=True)
class LoadedTokenizer:
    tokenizer: Tokenizer  # saved beside the shards, so any run can decode its data
    eos_id: int
    description: dict
    encoder: GPT2Encoder | TokenizersEncoder


def _byte_level(model: models.Model) -> Tokenizer:
    tokenizer = Tokenizer(model)
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def _gpt2(encoder_json: Path, vocab_bpe: Path, name: str) -> LoadedTokenizer:
    tokenizer = _byte_level(models.BPE.from_file(str(encoder_json), str(vocab_bpe)))
    tokenizer.add_special_tokens([EOS])  # already id 50256 in encoder.json; marks it as never split
    files = {"encoder.json": sha256_file(encoder_json), "vocab.bpe": sha256_file(vocab_bpe)}
    return LoadedTokenizer(tokenizer, tokenizer.token_to_id(EOS), {"kind": "gpt2", "name": name, "files": files},
                           GPT2Encoder(encoder_json, vocab_bpe))


def gpt2_from_files(directory: Path) -> LoadedTokenizer:
    missing = [name for name in GPT2_FILES if not (directory / name).is_file()]
    if missing:
        raise UsageError(f"GPT-2 tokenizer files {missing} not found in {directory}; {FETCH_HINT}")
    return _gpt2(directory / "encoder.json", directory / "vocab.bpe", "gpt2")


def gpt2_from_hub() -> LoadedTokenizer:
    """The hub's gpt2 repository holds the same two files as vocab.json and merges.txt."""
    try:
        from huggingface_hub import hf_hub_download

        files = [Path(hf_hub_download("gpt2", name)) for name in ("vocab.json", "merges.txt")]
    except Exception as exc:  # the hub client raises many types for "offline"
        raise UsageError(
            f"could not fetch the 'gpt2' tokenizer from the hub ({type(exc).__name__}); set the preset's "
            f"data.tokenizer.path to a directory with {' and '.join(GPT2_FILES)} ({FETCH_HINT})"
        ) from None
    return _gpt2(*files, "gpt2 (hub)")


def train_bpe(texts: Iterator[str], vocab_size: int) -> LoadedTokenizer:
    tokenizer = _byte_level(models.BPE())
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer)
    return LoadedTokenizer(tokenizer, tokenizer.token_to_id(EOS),
                           {"kind": "bpe", "name": f"byte-level-bpe-{vocab_size}", "requested_vocab_size": vocab_size},
                           TokenizersEncoder(tokenizer))


def load_tokenizer(cfg: TokenizerConfig, train_texts: Iterator[str]) -> LoadedTokenizer:
    """`train_texts` is consumed only when a tokenizer has to be trained."""
    if cfg.kind == "bpe":
        return train_bpe(train_texts, cfg.vocab_size)
    if cfg.path:
        return gpt2_from_files(Path(cfg.path))
    cached = default_gpt2_dir()
    if all((cached / name).is_file() for name in GPT2_FILES):
        return gpt2_from_files(cached)
    return gpt2_from_hub()
