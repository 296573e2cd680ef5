"""The suite on a machine without its system pieces: each test that needs one skips naming what is
missing, and with the GPT2DIST_REQUIRE_* variables set (as CI sets them) the same tests fail instead.
The machine is described by what its PATH holds: this interpreter's tools and a shell, nothing else."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import PIECES, REPO

pytestmark = pytest.mark.timeout(300)

# one test per piece, each stopped by its fixture before it starts anything
NEEDING = {
    "tests/launch/test_slurm_cluster.py::test_sbatch_job_of_two_tasks_runs_ddp_ranks_as_its_tasks": "slurmd",
    "tests/launch/test_emulated_nodes.py::test_nodes_have_their_names_addresses_and_shaped_links": "iproute2",
    "tests/containers/test_image.py::test_the_cpu_variant_builds_on_the_constrained_standin_base": "podman",
    "tests/data/test_prepare.py::test_gpt2_vocabulary_matches_tiktoken": "fetch_gpt2_tokenizer.sh",
    "tests/pipeline/test_report_in_a_browser.py::test_the_report_renders_offline_and_shows_every_figure": "chromium",
}


def bare_machine(tmp_path: Path, **variables: str) -> dict[str, str]:
    """An environment whose PATH has the virtual environment and a shell, and an empty tokenizer cache."""
    tools = tmp_path / "bin"
    tools.mkdir(parents=True)
    for name in ("sh", "bash", "env"):
        (tools / name).symlink_to(shutil.which(name))
    env = {key: value for key, value in os.environ.items() if key not in PIECES}
    empty = tmp_path / "no-tokenizer"
    empty.mkdir()
    return env | {"PATH": f"{Path(sys.executable).parent}:{tools}", "GPT2DIST_GPT2_TOKENIZER_DIR": str(empty)} | variables


def suite(env: dict[str, str]) -> subprocess.CompletedProcess:
    # in one process (-n 0): five tests that stop in their fixtures need no workers, each importing torch
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rsf", "-n", "0", *NEEDING],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=240)


@pytest.mark.slow  # two pytest sessions of their own
def test_a_missing_piece_skips_naming_it_unless_it_is_required(tmp_path):
    bare = suite(bare_machine(tmp_path / "bare"))
    assert bare.returncode == 0, bare.stdout[-3000:]
    assert f"{len(NEEDING)} skipped" in bare.stdout
    skips = bare.stdout.split("skip reasons")[1]
    for piece in NEEDING.values():
        assert piece in skips, (piece, skips)
    # the control: where CI requires every piece, the same machine fails each of those tests, naming it
    required = suite(bare_machine(tmp_path / "required", **dict.fromkeys(PIECES, "1")))
    outcome = required.stdout.strip().splitlines()[-1]  # a fixture's failure counts as an error, a test's as failed
    assert required.returncode != 0 and "skipped" not in outcome and "passed" not in outcome, outcome
    for variable in PIECES:
        assert f"{variable}=1 but" in required.stdout


SKIPPING = {
    "test_needs_network.py": 'import pytest\n\ndef test_x():\n    pytest.skip("needs a network")\n',
    "test_skips_while_collected.py": 'import pytest\npytest.skip("needs a network", allow_module_level=True)\n',
    "test_sounds_like_a_gpu.py": 'import pytest\n\ndef test_x():\n    pytest.skip("needs the GPU driver from the web")\n',
    "test_no_gpu.py": 'import pytest\n\ndef test_x():\n    pytest.skip("needs a CUDA GPU")\n',
}


@pytest.mark.slow  # four pytest sessions of their own
@pytest.mark.parametrize("name, fails", [("test_needs_network.py", True), ("test_skips_while_collected.py", True),
                                         ("test_sounds_like_a_gpu.py", True), ("test_no_gpu.py", False)])
def test_where_every_piece_is_required_an_unexpected_skip_fails_the_run(tmp_path, name, fails):
    """conftest's rule as CI meets it: a skip for any reason but the exact GPU ones fails the run, whether a test
    skips while it runs or a module while it is collected; a reason that merely mentions a GPU is not forgiven.
    The last case is the control: the absent GPU's own reason passes."""
    (tmp_path / name).write_text(SKIPPING[name])
    env = {**os.environ, **dict.fromkeys(PIECES, "1"), "PYTHONPATH": str(REPO / "tests")}
    result = subprocess.run([sys.executable, "-m", "pytest", "-p", "conftest", "-p", "no:cacheprovider", "-q",
                             "--rootdir", str(tmp_path), str(tmp_path / name)], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=120)
    assert (result.returncode != 0) is fails, result.stdout[-2000:]
    if fails:
        assert "error: 1 skip(s) that no unset GPT2DIST_REQUIRE_* allows" in result.stdout, result.stdout[-2000:]
