#!/usr/bin/env bash
# Make NVIDIA Apex with apex.amp importable in $PYTHON's environment.
#
# apex.amp was removed from Apex master in May 2025; tag 25.05 is the last release with
# it. If the base image already ships a working apex.amp this does nothing; otherwise it
# builds that tag with the C++ and CUDA extensions (nvcc must match torch's CUDA).
#
# Usage: containers/install_apex.sh [TAG]   (default 25.05). Env: PYTHON (default: python),
#        APEX_SRC (a checkout or .tar.gz of that tag, for a machine that cannot reach GitHub),
#        TORCH_CUDA_ARCH_LIST (e.g. 9.0: only the GPUs you run on) and MAX_JOBS, read by torch's build
set -euo pipefail
tag=${1:-25.05}
PYTHON=${PYTHON:-python}

if "$PYTHON" -c "import apex.amp, amp_C" 2>/dev/null; then
  echo "install_apex: the environment already has a working apex.amp; keeping it"; exit 0
fi
command -v nvcc >/dev/null || { echo "install_apex: nvcc not found; Apex's CUDA extensions need the CUDA toolkit" >&2; exit 1; }
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
if [[ -z ${APEX_SRC:-} ]]; then
  git clone --quiet --depth 1 --branch "$tag" https://github.com/NVIDIA/apex.git "$work/apex"
elif [[ -d $APEX_SRC ]]; then
  cp -r "$APEX_SRC" "$work/apex"
elif [[ -f $APEX_SRC ]]; then
  mkdir "$work/apex" && tar -xzf "$APEX_SRC" -C "$work/apex" --strip-components=1
else
  echo "install_apex: APEX_SRC=$APEX_SRC is neither a directory nor a file" >&2; exit 1
fi
[[ -f $work/apex/apex/amp/__init__.py ]] || { echo "install_apex: the source has no apex/amp (Apex removed it after tag 25.05)" >&2; exit 1; }
(cd "$work/apex" && "$PYTHON" -m pip install --no-build-isolation \
  --config-settings "--build-option=--cpp_ext" --config-settings "--build-option=--cuda_ext" .)
"$PYTHON" -c "import apex.amp, amp_C; print('install_apex: apex.amp and its CUDA extensions are importable')"
