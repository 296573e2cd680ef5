#!/usr/bin/env bash
# Make a base for containers/Dockerfile with podman and print its tag, from Debian 13 (mmdebstrap) and PyPI;
# nothing is pulled from a container registry. BASE: ngc (default: the stand-in for NVIDIA's NGC PyTorch
# 25.05, Containerfile beside this script, a CPU base that CI builds the cpu variant on) or pypi-cuda13
# (pypi-cuda13.Containerfile: PyPI's CUDA 13 torch and compiler, for the gpu variant).
# Cached by the content of this folder: in podman's storage, and as a saved tarball under
# ~/.cache/gpt2dist/images, which a machine with empty storage loads in about a minute
# instead of making the base again (about 4 minutes and 4 GB of downloads).
#
# Usage: containers/standin/build.sh [ngc|pypi-cuda13]   (the tag is the last line on stdout; progress on stderr)
# Env:   GPT2DIST_IMAGE_CACHE (default ~/.cache/gpt2dist/images), DEBIAN_MIRROR (default
#        http://deb.debian.org/debian), PIP_CERT (a CA bundle file for pip, mounted for the build)
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
die() { echo "error: standin/build.sh: $*" >&2; exit 2; }
for tool in podman mmdebstrap; do
  command -v $tool >/dev/null || die "$tool not found; apt-get install podman runc mmdebstrap"
done

base=${1:-ngc}
case $base in
  ngc) recipe=$HERE/Containerfile name=gpt2dist-standin-base ;;
  pypi-cuda13) recipe=$HERE/pypi-cuda13.Containerfile name=gpt2dist-pypi-cuda13-base ;;
  *) die "unknown base '$base' (use ngc or pypi-cuda13)" ;;
esac
toolchain=$HERE/../install_cuda_toolchain.sh
key=$(cat "$HERE/build.sh" "$recipe" $([[ $base == ngc ]] || echo "$toolchain") | sha256sum | cut -c1-16)
tag=localhost/$name:$key
cache_dir=${GPT2DIST_IMAGE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpt2dist/images}
tarball=$cache_dir/${name#gpt2dist-}-$key.tar
if podman image exists "$tag"; then echo "$tag"; exit 0; fi
if [[ -f $tarball ]]; then
  echo "standin: loading $tarball" >&2
  podman load -q -i "$tarball" >&2 && echo "$tag" && exit 0
  die "could not load $tarball; delete it to make the base again"
fi

work=$(mktemp -d -p "${TMPDIR:-/var/tmp}"); trap 'rm -rf "$work"' EXIT
echo "standin: Debian 13 (trixie) with mmdebstrap" >&2
mmdebstrap --quiet --variant=minbase \
  --include=python3,python3-pip,python3-venv,python3-dev,python-is-python3,g++,cmake,make,git,ca-certificates,openmpi-bin,libopenmpi-dev \
  trixie "$work/rootfs.tar" "${DEBIAN_MIRROR:-http://deb.debian.org/debian}" >&2 || die "mmdebstrap failed (above)"
os_tag=localhost/gpt2dist-standin-os:$(cat "$HERE/build.sh" | sha256sum | cut -c1-16)
podman image exists "$os_tag" || podman import -q "$work/rootfs.tar" "$os_tag" >&2
rm -f "$work/rootfs.tar"
args=(--format docker --network host --build-arg "OS_IMAGE=$os_tag" -t "$tag" -f "$recipe")
if [[ -n ${PIP_CERT:-} ]]; then
  [[ -f $PIP_CERT ]] || die "PIP_CERT names '$PIP_CERT', which is not a file"
  args+=(-v "$PIP_CERT:/run/pip-ca.crt:ro" --build-arg PIP_CERT=/run/pip-ca.crt)
fi
# the folder above is the context: pypi-cuda13 copies install_cuda_toolchain.sh from it
podman build "${args[@]}" "$HERE/.." >&2 || die "the $base base did not build (above)"
mkdir -p "$cache_dir"
echo "standin: saving $tarball" >&2
podman save -q -o "$tarball.partial" "$tag" && mv "$tarball.partial" "$tarball"
echo "$tag"
