#!/usr/bin/env bash
# Install PyPI's torch and the CUDA compiler of torch's CUDA release into $PYTHON's environment, so C++/CUDA
# extensions (Apex, Horovod's NCCL operations) compile against that torch without a GPU and without NVIDIA's
# toolkit installer. Prints the toolkit's folder (CUDA_HOME) as its last line.
#
# PyPI splits the compiler into wheels: nvcc, and nvvm and crt pinned to the same release (unpinned, pip takes
# newer ones whose PTX this ptxas refuses), and CCCL's headers; torch's own wheels bring the runtime and library
# headers. The runtime wheel ships libcudart.so.13 only, and extensions link with -lcudart: a link is added.
#
# Usage: containers/install_cuda_toolchain.sh   Env: PYTHON (default python), TORCH_VERSION (default 2.11.0)
set -euo pipefail
PYTHON=${PYTHON:-python}
TORCH_VERSION=${TORCH_VERSION:-2.11.0}
die() { echo "install_cuda_toolchain: $*" >&2; exit 1; }

"$PYTHON" -m pip install --quiet "torch==$TORCH_VERSION" numpy >&2
release=$("$PYTHON" -c 'import torch; print(torch.version.cuda or "")')
[[ -n $release ]] || die "torch $TORCH_VERSION from this index is a CPU build; its CUDA build is needed"
"$PYTHON" -m pip install --quiet "nvidia-cuda-nvcc==$release.*" "nvidia-nvvm==$release.*" "nvidia-cuda-crt==$release.*" \
  "nvidia-cuda-cccl==$release.*" >&2
site=$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
home=$site/nvidia/cu${release%%.*}
[[ -x $home/bin/nvcc ]] || die "no nvcc under $home; the nvidia-cuda-nvcc wheel's layout changed"
[[ -e $home/lib/libcudart.so ]] || ln -s "libcudart.so.${release%%.*}" "$home/lib/libcudart.so"
"$home/bin/nvcc" --version | grep -q "release $release," || die "$home/bin/nvcc is not CUDA $release"
echo "$home"
