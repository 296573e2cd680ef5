"""Data stage: corpora, tokenizers and the token shards every run reads (`gpt2dist prepare`, `verify`).
May import config, io, errors and logs; nothing from training, launch, results or pipeline."""
