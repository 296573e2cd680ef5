#!/usr/bin/env bash
# Build and install Horovod 0.28.1 against the torch already installed in $PYTHON.
#
# Why a script: 0.28.1 is Horovod's last release and its sdist does not build as shipped
# with torch >= 2.1 (C++14) or GCC 13 (missing includes); patch_horovod_source.sh fixes
# both. We build a wheel once and cache it keyed by Horovod, torch, Python and GPU
# flavour, so CI, the README setup and the container recipe all run this one tested recipe.
#
# Usage: containers/install_horovod.sh [--cpu|--gpu]   (default: --gpu when nvcc and a
#        CUDA build of torch are present, else --cpu)
# Env:   PYTHON (default: python), GPT2DIST_WHEEL_CACHE (default: ~/.cache/gpt2dist/wheels)
set -euo pipefail

HOROVOD_VERSION=0.28.1
PYTHON=${PYTHON:-python}
CACHE_ROOT=${GPT2DIST_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpt2dist/wheels}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

die() { echo "install_horovod: $*" >&2; exit 1; }

torch_cuda=$("$PYTHON" -c 'import torch; print(torch.version.cuda or "")' 2>/dev/null) \
  || die "torch is not importable from $PYTHON; install torch first (pip install torch)"
torch_version=$("$PYTHON" -c 'import torch; print(torch.__version__)')
py_tag=$("$PYTHON" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')

flavour=${1:-auto}
if [[ $flavour == auto ]]; then
  if [[ -n $torch_cuda ]] && command -v nvcc >/dev/null; then flavour=--gpu; else flavour=--cpu; fi
fi
case $flavour in
  --cpu) variant=cpu ;;
  --gpu) [[ -n $torch_cuda ]] || die "--gpu needs a CUDA build of torch (found $torch_version)"
         variant=cuda${torch_cuda}-nccl-shared ;;
  *) die "unknown option '$flavour' (use --cpu or --gpu)" ;;
esac

# The key leaves the source patches out on purpose: they only let a compiler build the sdist
# (C++17 for torch's headers; includes that GCC 12 still pulled in transitively), so a wheel
# that built is the same code with or without them, and a cached GCC 12 wheel stays valid.
# A patch that changed what Horovod does would have to join the key, as the NCCL link mode
# (which changes the binary) does in the --gpu variant.
cache_dir="$CACHE_ROOT/horovod-$HOROVOD_VERSION/torch-${torch_version}-${py_tag}-${variant}"
wheel=$(ls "$cache_dir"/horovod-*.whl 2>/dev/null | head -n 1 || true)

if [[ -z $wheel ]]; then
  echo "install_horovod: building Horovod $HOROVOD_VERSION for torch $torch_version ($variant); takes ~5 min on 2 cores"
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  "$PYTHON" -m pip download --quiet --no-deps --no-binary :all: "horovod==$HOROVOD_VERSION" -d "$work" \
    || die "could not download the horovod==$HOROVOD_VERSION sdist from the package index"
  tar -xzf "$work/horovod-$HOROVOD_VERSION.tar.gz" -C "$work"
  src="$work/horovod-$HOROVOD_VERSION"
  bash "$HERE/patch_horovod_source.sh" "$src"
  # CMake 4 removed support for cmake_minimum_required(<3.5), which the vendored gloo uses. It
  # goes into a throwaway environment on PATH, not $PYTHON's: a base image whose pip constraint
  # file pins another cmake (NGC's) would refuse it. Horovod's own dependencies go into $PYTHON's.
  "$PYTHON" -m venv "$work/tools"
  "$work/tools/bin/python" -m pip install --quiet "cmake>=3.13,<4"
  mkdir "$work/bin" && ln -s "$work/tools/bin/cmake" "$work/bin/cmake"  # cmake only, not that python
  export PATH="$work/bin:$PATH"
  "$PYTHON" -m pip install --quiet packaging psutil pyyaml cloudpickle
  export HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1
  if [[ $variant == cpu ]]; then
    export HOROVOD_WITHOUT_MPI=1
  else
    # Link the libnccl.so that torch loads, not a second, static copy of NCCL.
    export HOROVOD_GPU_OPERATIONS=NCCL HOROVOD_WITH_MPI=1 HOROVOD_NCCL_LINK=SHARED
  fi
  "$PYTHON" -m pip wheel --no-build-isolation --no-deps -w "$work/dist" "$src" \
    > "$work/build.log" 2>&1 || { grep -A12 -m3 -E 'CMake Error|error:' "$work/build.log" >&2 || tail -n 40 "$work/build.log" >&2; die "Horovod build failed (log above)"; }
  mkdir -p "$cache_dir"
  built=$(ls "$work"/dist/horovod-*.whl)
  # Copy under a temporary name, then rename: a killed build never leaves a half wheel in the cache.
  cp "$built" "$cache_dir/.partial"
  mv "$cache_dir/.partial" "$cache_dir/$(basename "$built")"
  wheel="$cache_dir/$(basename "$built")"
fi

"$PYTHON" -m pip install --quiet "$wheel"
"$PYTHON" - <<'PY'
import horovod
import horovod.torch as hvd
assert hvd.gloo_built(), "Horovod was built without Gloo"
print(f"install_horovod: horovod {horovod.__version__} ok (gloo={hvd.gloo_built()}, mpi={hvd.mpi_built()}, nccl={hvd.nccl_built()})")
PY
