#!/usr/bin/env bash
# Create .venv with torch, gpt2dist (editable, with test tools and the SLURM executor
# plugin) and Horovod.
# Used by the README's two commands and by .ci/run; the container recipe calls
# install_horovod.sh the same way.
#
# Env: TORCH_VERSION (default 2.13.0), VENV (default .venv), PYTHON (default python3),
#      HOROVOD_FLAVOUR (--cpu, --gpu, or none to skip Horovod; default: install_horovod.sh
#      decides, which picks --gpu for a CUDA build of torch when nvcc exists, even without a GPU)
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${VENV:-.venv}
TORCH_VERSION=${TORCH_VERSION:-2.13.0}

if [[ ! -x $VENV/bin/python ]]; then
  "${PYTHON:-python3}" -m venv "$VENV"
fi
py=$VENV/bin/python
"$py" -m pip install --quiet --upgrade pip setuptools wheel
# Pin torch first: an unpinned resolve may pull a different (much larger) build.
"$py" -m pip install --quiet "torch==$TORCH_VERSION" numpy
"$py" -m pip install --quiet -e ".[test,cluster]"
if [[ ${HOROVOD_FLAVOUR:-} != none ]]; then
  PYTHON=$py bash containers/install_horovod.sh ${HOROVOD_FLAVOUR:-}
fi
# GPT-2's tokenizer files, for the paper preset and the tests that check the real vocabulary.
bash containers/fetch_gpt2_tokenizer.sh \
  || echo "setup_env: warning: GPT-2 tokenizer files not fetched; tests that need them will skip" >&2
"$py" -c "import gpt2dist, torch; print(f'setup_env: gpt2dist {gpt2dist.__version__}, torch {torch.__version__}, venv {\"$VENV\"}')"
