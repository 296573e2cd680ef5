#!/usr/bin/env bash
# Make NVIDIA Apex with apex.amp importable in $PYTHON's environment.
#
# apex.amp was removed from Apex master in May 2025; tag 25.05 is the last release with
# it. If the base image already ships a working apex.amp this does nothing; otherwise it
# builds that tag with the C++ and CUDA extensions (nvcc must match torch's CUDA).
#
# Usage: containers/install_apex.sh [TAG]   (default 25.05). Env: PYTHON (default: python)
set -euo pipefail
tag=${1:-25.05}
PYTHON=${PYTHON:-python}

if "$PYTHON" -c "import apex.amp, amp_C" 2>/dev/null; then
  echo "install_apex: the environment already has a working apex.amp; keeping it"; exit 0
fi
command -v nvcc >/dev/null || { echo "install_apex: nvcc not found; Apex's CUDA extensions need the CUDA toolkit" >&2; exit 1; }
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
git clone --quiet --depth 1 --branch "$tag" https://github.com/NVIDIA/apex.git "$work/apex"
(cd "$work/apex" && "$PYTHON" -m pip install --no-build-isolation \
  --config-settings "--build-option=--cpp_ext" --config-settings "--build-option=--cuda_ext" .)
"$PYTHON" -c "import apex.amp, amp_C; print('install_apex: apex.amp and its CUDA extensions are importable')"
