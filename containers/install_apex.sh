#!/usr/bin/env bash
# Make NVIDIA Apex with apex.amp and apex.parallel importable in $PYTHON's environment.
#
# apex.amp was removed from Apex master in May 2025; tag 25.05 is the last release with it.
# If the environment already has a working apex.amp (NGC's base) this does nothing; otherwise
# it builds a wheel of that tag with only the extensions the study runs: amp_C (amp's fused
# unscale, scale and norm kernels) and apex_C (apex.parallel's flatten/unflatten). Apex's
# --cuda_ext would also compile about ten kernels the study never calls (softmax, MLP, layer
# norm, syncbn...), an hour more on 2 cores. The wheel is cached, keyed by everything that goes
# into it, and rebuilt only when one of those changes.
#
# Usage: containers/install_apex.sh [TAG]   (default 25.05)
# Env:   PYTHON (default: python); APEX_SRC (a checkout or .tar.gz of that tag, for a machine that
#        cannot reach GitHub); TORCH_CUDA_ARCH_LIST (default "8.0;9.0": A100 and H100/H200);
#        MAX_JOBS (parallel compiles); GPT2DIST_WHEEL_CACHE (default ~/.cache/gpt2dist/wheels);
#        APEX_WHEEL_ONLY=1 builds and caches the wheel without installing it (to carry elsewhere).
set -euo pipefail
tag=${1:-25.05}
PYTHON=${PYTHON:-python}
EXTENSIONS="amp_C apex_C"
CACHE_ROOT=${GPT2DIST_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpt2dist/wheels}
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-8.0;9.0}

die() { echo "install_apex: $*" >&2; exit 1; }

if [[ ${APEX_WHEEL_ONLY:-0} != 1 ]] && "$PYTHON" -c "import apex.amp, amp_C, apex_C" 2>/dev/null; then
  echo "install_apex: the environment already has a working apex.amp; keeping it"; exit 0
fi
command -v nvcc >/dev/null || die "nvcc not found; Apex's CUDA extensions need the CUDA toolkit"
# torch's builder takes CUDA_HOME from nvcc's folder, which is wrong for a wrapper script on PATH
if [[ -z ${CUDA_HOME:-} ]]; then
  if [[ -x /usr/local/cuda/bin/nvcc ]]; then export CUDA_HOME=/usr/local/cuda
  else CUDA_HOME=$(dirname "$(dirname "$(command -v nvcc)")"); export CUDA_HOME; fi
fi
# A toolkit assembled from PyPI's compiler wheels has no library headers (cusparse.h, cublas_v2.h);
# torch's own CUDA wheels carry them, matching the libraries torch loads.
wheel_include=$("$PYTHON" -c 'import glob, os, nvidia; print(":".join(d for p in nvidia.__path__ for d in glob.glob(os.path.join(p, "cu[0-9]*", "include"))))' 2>/dev/null || true)
[[ -n $wheel_include ]] && export CPATH=$wheel_include${CPATH:+:$CPATH}
read -r torch_version torch_cuda py_tag < <("$PYTHON" -c \
  'import sys, torch; print(torch.__version__, torch.version.cuda or "none", f"cp{sys.version_info[0]}{sys.version_info[1]}")') \
  || die "torch is not importable from $PYTHON; install torch first"
nvcc_cuda=$(nvcc --version | sed -n 's/.*release \([0-9.]*\),.*/\1/p')
[[ $torch_cuda == "$nvcc_cuda" ]] \
  || die "nvcc is CUDA $nvcc_cuda but torch $torch_version was built with CUDA $torch_cuda; Apex refuses the mismatch: use the toolkit of torch's CUDA"
# The source by its hash where it is a file (a tag fetched from GitHub is named by the tag)
src_id=git
[[ -f ${APEX_SRC:-} ]] && src_id=src$(sha256sum "$APEX_SRC" | cut -c1-12)
key="torch-${torch_version}-${py_tag}-cuda${torch_cuda}-arch${TORCH_CUDA_ARCH_LIST//;/_}-${EXTENSIONS// /_}-$src_id"
cache_dir="$CACHE_ROOT/apex-$tag/$key"
wheel=$(ls "$cache_dir"/apex-*.whl 2>/dev/null | head -n 1 || true)

if [[ -z $wheel ]]; then
  echo "install_apex: building Apex $tag ($EXTENSIONS) for torch $torch_version, CUDA arch $TORCH_CUDA_ARCH_LIST"
  work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
  if [[ -z ${APEX_SRC:-} ]]; then
    git clone --quiet --depth 1 --branch "$tag" https://github.com/NVIDIA/apex.git "$work/apex"
  elif [[ -d $APEX_SRC ]]; then
    cp -r "$APEX_SRC" "$work/apex"
  elif [[ -f $APEX_SRC ]]; then
    mkdir "$work/apex" && tar -xzf "$APEX_SRC" -C "$work/apex" --strip-components=1
  else
    die "APEX_SRC=$APEX_SRC is neither a directory nor a file"
  fi
  [[ -f $work/apex/apex/amp/__init__.py ]] || die "the source has no apex/amp (Apex removed it after tag 25.05)"
  # Keep only the extensions named above; fail loudly if setup.py no longer has the line this edits.
  sed -i "s/^setup($/ext_modules = [e for e in ext_modules if e.name in \"$EXTENSIONS\".split()]\n&/" "$work/apex/setup.py"
  grep -q '^ext_modules = \[e for e in ext_modules' "$work/apex/setup.py" || die "could not limit setup.py's extensions; the source layout changed"
  (cd "$work/apex" && "$PYTHON" -m pip wheel --no-build-isolation --no-deps -w "$work/dist" \
    --config-settings "--build-option=--cpp_ext" --config-settings "--build-option=--cuda_ext" .) > "$work/build.log" 2>&1 || {
      mkdir -p "$CACHE_ROOT" && cp "$work/build.log" "$CACHE_ROOT/apex-build.log"
      grep -m5 -B2 -A8 -E 'error|Error' "$work/build.log" >&2 || true
      die "Apex build failed (whole log: $CACHE_ROOT/apex-build.log)"; }
  built=$(ls "$work"/dist/apex-*.whl)
  mkdir -p "$cache_dir"
  cp "$built" "$cache_dir/.partial" && mv "$cache_dir/.partial" "$cache_dir/$(basename "$built")"
  wheel="$cache_dir/$(basename "$built")"
fi
echo "install_apex: wheel $wheel"
[[ ${APEX_WHEEL_ONLY:-0} == 1 ]] && exit 0
"$PYTHON" -m pip install --quiet --no-deps --force-reinstall "$wheel"
"$PYTHON" -c "import apex.amp, apex.parallel, amp_C, apex_C; print('install_apex: apex.amp, apex.parallel, amp_C and apex_C import')"
