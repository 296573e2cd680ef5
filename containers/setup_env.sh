#!/usr/bin/env bash
# Create .venv with torch, gpt2dist (editable, with test tools and the SLURM executor
# plugin) and Horovod.
# Used by the README's two commands and by .ci/run; the container recipe calls
# install_horovod.sh the same way.
#
# Env: TORCH_VERSION (default 2.13.0), VENV (default .venv), PYTHON (default: the faster Python of two,
#      containers/pick_python.sh), APEX (none: skip Apex on a GPU node),
#      HOROVOD_FLAVOUR (--cpu, --gpu, or none to skip Horovod; default: install_horovod.sh
#      decides, which picks --gpu for a CUDA build of torch when nvcc exists, even without a GPU)
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${VENV:-.venv}
TORCH_VERSION=${TORCH_VERSION:-2.13.0}

if [[ ! -x $VENV/bin/python ]]; then
  PYTHON=${PYTHON:-$(bash containers/pick_python.sh)}
  echo "setup_env: the venv's Python is $PYTHON" >&2
  "$PYTHON" -m venv "$VENV"
fi
py=$VENV/bin/python
"$py" -m pip install --quiet --upgrade pip setuptools wheel
# Pin torch first: an unpinned resolve may pull a different (much larger) build.
"$py" -m pip install --quiet "torch==$TORCH_VERSION" numpy
"$py" -m pip install --quiet -e ".[test,cluster]"
# gpt2dist's bytecode: an editable install leaves none, and where PYTHONDONTWRITEBYTECODE is set no process
# writes it, so every rank and command compiled the package anew (about half a CPU-second each on a 2-core EPYC)
"$py" -m compileall -q src/gpt2dist >/dev/null
if [[ ${HOROVOD_FLAVOUR:-} != none ]]; then
  PYTHON=$py bash containers/install_horovod.sh ${HOROVOD_FLAVOUR:-}
fi
# On a GPU node, `preset: auto` is the paper study, whose Apex rows need NVIDIA Apex's CUDA extensions: built
# where the CUDA toolkit is (nvcc), else one line says what to run (a CPU machine needs nothing of it).
if [[ ${APEX:-auto} != none ]] && command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
  if command -v nvcc >/dev/null; then
    PYTHON=$py bash containers/install_apex.sh
  else
    echo "setup_env: this node has NVIDIA GPUs, and the paper study's Apex rows need NVIDIA Apex: install the CUDA" \
         "toolkit (nvcc) and run PYTHON=$py containers/install_apex.sh, or run in the image (containers/)" >&2
  fi
fi
# GPT-2's tokenizer files, for the paper preset and the tests that check the real vocabulary.
bash containers/fetch_gpt2_tokenizer.sh \
  || echo "setup_env: warning: GPT-2 tokenizer files not fetched; tests that need them will skip" >&2
"$py" -c "import gpt2dist, torch; print(f'setup_env: gpt2dist {gpt2dist.__version__}, torch {torch.__version__}, venv {\"$VENV\"}')"
