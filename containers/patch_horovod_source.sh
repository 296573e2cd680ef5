#!/usr/bin/env bash
# Patch an unpacked Horovod 0.28.1 sdist so it builds against torch >= 2.1 and with GCC 13 and 14.
#
# A script of its own so a CPU test can run it on the real sdist; install_horovod.sh calls it.
# Re-running it changes nothing, and it fails loudly when a patch does not apply, which
# means the sdist is not the one these patches were written for.
#
# Usage: containers/patch_horovod_source.sh SRC_DIR   (the unpacked horovod-0.28.1 directory)
set -euo pipefail

die() { echo "patch_horovod_source: $*" >&2; exit 1; }

src=${1:-}
[[ -n $src ]] || die "usage: patch_horovod_source.sh SRC_DIR (an unpacked horovod sdist)"
[[ -f $src/CMakeLists.txt && -f $src/horovod/common/common.h ]] || die "$src is not an unpacked Horovod sdist"

# torch >= 2.1 headers reject C++14. The top-level CMakeLists needs it too, or gloo's
# rendezvous Store symbol is defined twice at link time.
for cmake in "$src/CMakeLists.txt" "$src/horovod/torch/CMakeLists.txt"; do
  sed -i 's/set(CMAKE_CXX_STANDARD 14)/set(CMAKE_CXX_STANDARD 17)/' "$cmake"
  if grep -q 'CMAKE_CXX_STANDARD 14' "$cmake" || ! grep -q 'set(CMAKE_CXX_STANDARD 17)' "$cmake"; then
    die "C++17 patch did not apply to $cmake; the sdist layout changed"
  fi
done

# GCC 13's standard headers no longer include these transitively (upstream horovod#3957,
# merged after 0.28.1, in no release).
add_include() {  # FILE HEADER AFTER: put `#include <HEADER>` after `#include <AFTER>`, once
  local file=$src/$1
  grep -q "^#include <$2>\$" "$file" && return 0
  sed -i "s|^#include <$3>\$|&\n#include <$2>|" "$file"
  grep -q "^#include <$2>\$" "$file" || die "could not add #include <$2> to $1 (no #include <$3>); the sdist layout changed"
}
add_include horovod/common/common.h stdexcept memory
add_include horovod/common/group_table.h string queue

# GCC 14 rejects the vendored flatbuffers' span copy-assignment, which assigns span's const
# members (and returns nothing), even uninstantiated. No code can have called it, so it goes;
# the copy-assignment the compiler declares instead is deleted, as that operator was in effect.
span=third_party/flatbuffers/include/flatbuffers/stl_emulation.h
sed -i '/^  FLATBUFFERS_CONSTEXPR_CPP14 span &operator=(const span &other)$/,/^  }$/d' "$src/$span"
grep -q 'span &operator=' "$src/$span" && die "could not remove span's copy-assignment from $span"
grep -q 'span(const span &other)' "$src/$span" || die "$span lost span's copy constructor; the sdist layout changed"
