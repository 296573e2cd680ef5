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
# Env:   PYTHON (default: python), GPT2DIST_WHEEL_CACHE (default: ~/.cache/gpt2dist/wheels),
#        HOROVOD_BUILD_CUDA_CC_LIST (e.g. 80,90: the compute capabilities you run on; default: those of
#        TORCH_CUDA_ARCH_LIST, else 80,90), HOROVOD_WHEEL_ONLY=1 (build and cache the wheel without
#        installing it, to carry elsewhere: containers/build_gpu_wheels.sh). Offline: PIP_NO_INDEX=1
#        PIP_FIND_LINKS=DIR with the sdist and a cmake<4 wheel.
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
         # MPI when its compiler is there (the image has OpenMPI); otherwise the Gloo controller alone
         if command -v mpicxx >/dev/null; then
           # the MPI library the wheel links is part of its identity (Debian's Open MPI 4, PyPI's 5, HPC-X)
           controller=mpi-$(mpicxx --showme:version 2>/dev/null | sed -n 's/.*Open MPI \([0-9.]*\).*/openmpi\1/p')
           [[ $controller == mpi- ]] && controller=mpi
         else controller=gloo; fi
         # CUDA 13 compiles nothing older than Turing: name the capabilities, from torch's list when set
         if [[ -z ${HOROVOD_BUILD_CUDA_CC_LIST:-} ]]; then
           HOROVOD_BUILD_CUDA_CC_LIST=$(tr ';' '\n' <<<"${TORCH_CUDA_ARCH_LIST:-8.0;9.0}" | sed 's/[^0-9]//g' | paste -sd, -)
         fi
         export HOROVOD_BUILD_CUDA_CC_LIST
         variant=cuda${torch_cuda}-nccl-shared-$controller-sm${HOROVOD_BUILD_CUDA_CC_LIST//,/_} ;;
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
  # setup.py's setup_requires (cffi for the torch extension): present, or setuptools tries to fetch them
  "$PYTHON" -m pip install --quiet packaging psutil pyyaml cloudpickle "cffi>=1.4.0"
  export HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1
  if [[ $variant == cpu ]]; then
    export HOROVOD_WITHOUT_MPI=1
  else
    # Link the libnccl.so that torch loads, not a second, static copy of NCCL.
    export HOROVOD_GPU_OPERATIONS=NCCL HOROVOD_NCCL_LINK=SHARED
    [[ -n ${CUDA_HOME:-} ]] && export HOROVOD_CUDA_HOME=${HOROVOD_CUDA_HOME:-$CUDA_HOME}
    if [[ $controller == mpi* ]]; then
      export HOROVOD_WITH_MPI=1
    else
      echo "install_horovod: no MPI compiler (mpicxx) on PATH; building the Gloo controller only"
      export HOROVOD_WITHOUT_MPI=1
    fi
    # A pip-installed torch loads NCCL from its nvidia-nccl wheel, which ships libnccl.so.2 but no
    # libnccl.so for the linker to find: give it one beside that wheel's headers.
    wheel_nccl=$("$PYTHON" - <<'PY'
import glob, os
import nvidia
found = [h for p in nvidia.__path__ for h in glob.glob(os.path.join(p, "**", "include", "nccl.h"), recursive=True)]
print(os.path.dirname(os.path.dirname(found[0])) if found else "")
PY
    ) || wheel_nccl=""
    if [[ -n $wheel_nccl && -z ${HOROVOD_NCCL_HOME:-}${HOROVOD_NCCL_LIB:-} && -e $wheel_nccl/lib/libnccl.so.2 ]]; then
      mkdir -p "$work/nccl-lib" && ln -s "$wheel_nccl/lib/libnccl.so.2" "$work/nccl-lib/libnccl.so"
      export HOROVOD_NCCL_INCLUDE=$wheel_nccl/include HOROVOD_NCCL_LIB=$work/nccl-lib
      echo "install_horovod: linking the NCCL of torch's nvidia-nccl wheel ($wheel_nccl)"
    fi
  fi
  "$PYTHON" -m pip wheel --no-build-isolation --no-deps -w "$work/dist" "$src" \
    > "$work/build.log" 2>&1 || {
      mkdir -p "$CACHE_ROOT" && cp "$work/build.log" "$CACHE_ROOT/horovod-build.log"
      grep -B2 -A12 -m3 -E 'CMake Error|error: |Error [0-9]|Traceback' "$work/build.log" | grep -v 'subprocess-exited-with-error' >&2
      tail -n 25 "$work/build.log" >&2
      die "Horovod build failed (above; whole log: $CACHE_ROOT/horovod-build.log)"; }
  mkdir -p "$cache_dir"
  built=$(ls "$work"/dist/horovod-*.whl)
  # Copy under a temporary name, then rename: a killed build never leaves a half wheel in the cache.
  cp "$built" "$cache_dir/.partial"
  mv "$cache_dir/.partial" "$cache_dir/$(basename "$built")"
  wheel="$cache_dir/$(basename "$built")"
fi

echo "install_horovod: wheel $wheel"
[[ ${HOROVOD_WHEEL_ONLY:-0} == 1 ]] && exit 0
"$PYTHON" -m pip install --quiet "$wheel"
"$PYTHON" - <<'PY'
import horovod
import horovod.torch as hvd
assert hvd.gloo_built(), "Horovod was built without Gloo"
print(f"install_horovod: horovod {horovod.__version__} ok (gloo={hvd.gloo_built()}, mpi={hvd.mpi_built()}, nccl={hvd.nccl_built()})")
PY
