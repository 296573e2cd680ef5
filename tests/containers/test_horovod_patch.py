"""containers/patch_horovod_source.sh on the real Horovod 0.28.1 sdist, as install_horovod.sh runs it:
exactly the intended edits, none on a second run, and a loud failure on source they do not fit."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO

PATCH = REPO / "containers" / "patch_horovod_source.sh"
SPAN = "third_party/flatbuffers/include/flatbuffers/stl_emulation.h"
PATCHED_FILES = {"CMakeLists.txt", "horovod/torch/CMakeLists.txt", "horovod/common/common.h",
                 "horovod/common/group_table.h", SPAN}


pytestmark = pytest.mark.slow  # Horovod's source, downloaded and unpacked


@pytest.fixture(scope="module")
def sdist(tmp_path_factory) -> Path:
    where = tmp_path_factory.mktemp("horovod-sdist")
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
                    "horovod==0.28.1", "-d", str(where)], check=True, timeout=300)
    # unpacked as install_horovod.sh unpacks it (tar's extraction filters need Python 3.11.4 or newer)
    subprocess.run(["tar", "-xzf", str(where / "horovod-0.28.1.tar.gz"), "-C", str(where)], check=True, timeout=120)
    return where / "horovod-0.28.1"


def patch(src: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(PATCH), str(src)], capture_output=True, text=True, timeout=60)


def digests(src: Path) -> dict[str, str]:
    return {str(path.relative_to(src)): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(src.rglob("*")) if path.is_file()}


def includes(path: Path) -> list[str]:
    return [line for line in path.read_text().splitlines() if line.startswith("#include <")]


@pytest.mark.timeout(420)
def test_patches_apply_and_reapplying_changes_nothing(sdist, tmp_path):
    src = tmp_path / "horovod"
    shutil.copytree(sdist, src)
    pristine = digests(src)
    assert "set(CMAKE_CXX_STANDARD 14)" in (src / "CMakeLists.txt").read_text()  # the sdist still needs it

    result = patch(src)
    assert result.returncode == 0, result.stderr
    patched = digests(src)
    assert {name for name in patched if patched[name] != pristine[name]} == PATCHED_FILES
    for cmake in ("CMakeLists.txt", "horovod/torch/CMakeLists.txt"):
        text = (src / cmake).read_text()
        assert "set(CMAKE_CXX_STANDARD 17)" in text and "CMAKE_CXX_STANDARD 14" not in text
    common = includes(src / "horovod/common/common.h")
    assert common.count("#include <stdexcept>") == 1
    assert common.index("#include <stdexcept>") == common.index("#include <memory>") + 1
    table = includes(src / "horovod/common/group_table.h")
    assert table.count("#include <string>") == 1
    assert table.index("#include <string>") == table.index("#include <queue>") + 1

    # the span copy-assignment GCC 14 rejects is gone, and only it (5 lines)
    before, after = (sdist / SPAN).read_text().splitlines(), (src / SPAN).read_text().splitlines()
    removed = [line for line in before if line not in after]
    assert removed[0] == "  FLATBUFFERS_CONSTEXPR_CPP14 span &operator=(const span &other)" and len(removed) == 4
    assert len(before) - len(after) == 5  # and its closing brace

    again = patch(src)
    assert again.returncode == 0, again.stderr
    assert digests(src) == patched


@pytest.mark.timeout(420)
def test_source_the_patches_do_not_fit_fails_loudly(sdist, tmp_path):
    src = tmp_path / "horovod"
    shutil.copytree(sdist, src)
    common = src / "horovod/common/common.h"
    common.write_text(common.read_text().replace("#include <memory>\n", ""))
    result = patch(src)
    assert result.returncode == 1
    assert "could not add #include <stdexcept> to horovod/common/common.h" in result.stderr

    result = patch(tmp_path / "empty")
    assert result.returncode == 1 and "is not an unpacked Horovod sdist" in result.stderr
