"""The image recipe and the environment check: lint, one recipe, containers on every rule, doctor."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import REPO, gpt2dist

DOCKERFILE = REPO / "containers" / "Dockerfile"


def test_hadolint_finds_no_errors():
    hadolint = shutil.which("hadolint") or str(Path(sys.executable).with_name("hadolint"))
    recipes = [DOCKERFILE, REPO / "containers" / "standin" / "Containerfile"]
    result = subprocess.run([hadolint, *map(str, recipes)], capture_output=True, text=True)  # warnings fail too
    assert result.returncode == 0, result.stdout + result.stderr


def test_dockerfile_runs_the_scripts_ci_runs():
    text = DOCKERFILE.read_text()
    # one recipe for both variants: gpu (the default) and cpu differ only by VARIANT
    assert re.search(r"^ARG VARIANT=gpu$", text, re.M) and 'bash containers/install_horovod.sh "--${VARIANT}"' in text
    assert "bash containers/install_apex.sh" in text
    assert "--require-hashes -r containers/requirements.lock" in text and "gpt2dist doctor --no-gpu" in text
    setup = (REPO / "containers" / "setup_env.sh").read_text()
    assert "bash containers/install_horovod.sh" in setup and "containers/setup_env.sh" in (REPO / ".ci" / "run").read_text()
    assert re.search(r"^FROM \$\{BASE_IMAGE\}", text, re.M) and "nvcr.io/nvidia/pytorch:25.05-py3" in text


def test_every_rule_runs_in_the_params_image():
    image = yaml.safe_load((REPO / "params.yaml").read_text())["container"]
    rules = 0
    for path in sorted((REPO / "workflow" / "rules").glob("*.smk")):
        for block in re.split(r"^rule ", path.read_text(), flags=re.M)[1:]:
            if block.startswith("round_done:"):  # order only: no command to run anywhere
                continue
            rules += 1
            assert re.search(r'^\s+container:\n\s+config\["container"\]', block, re.M), f"{path.name}: rule {block.split(':')[0]}"
    assert rules == 6 and image == "containers/gpt2dist.sif"  # prepare, selftest, train, collect, plot, report


def test_lock_pins_every_package_with_a_hash():
    lines = (REPO / "containers" / "requirements.lock").read_text()
    pinned = re.findall(r"^([a-z0-9._-]+)==", lines, re.M)
    assert len(pinned) > 50 and "torch" not in pinned and "snakemake" in pinned
    assert lines.count("--hash=sha256:") >= len(pinned)


def test_doctor_passes_for_the_cpu_study():
    result = gpt2dist("doctor", "--no-gpu", "--params", REPO / "params.yaml", "--preset", "cpu")
    assert "Horovod" in result.stdout and "gloo True" in result.stdout
    assert "ok: everything preset 'cpu' (60 runs) needs is here" in result.stdout


@pytest.mark.skipif(__import__("importlib").util.find_spec("apex") is not None, reason="Apex is installed here")
def test_doctor_lists_what_the_paper_study_misses():
    result = gpt2dist("doctor", "--no-gpu", "--gpus", "8", "--params", REPO / "params.yaml", "--preset", "paper",
                      check=False)
    last = result.stderr.strip().splitlines()[-1]
    assert result.returncode == 2 and last.startswith("error: preset 'paper' needs what is missing here: ")
    assert "NVIDIA Apex (apex.amp), needed by ddp-apex-O1-n1, " in last
    assert "horovod-apex-O1-n8" in last
    assert "NVIDIA Apex (apex.parallel), needed by apex-ddp-apex-O2-n1, " in last
    assert "apex-ddp-apex-O2-n8: run inside the gpt2dist container image (containers/), which builds it" in last


def test_doctor_names_horovod_when_it_cannot_be_imported(tmp_path):
    """A real missing piece: Horovod hidden from the interpreter's import path."""
    env = {**os.environ, "PYTHONNOUSERSITE": "1"}
    blocker = tmp_path / "sitecustomize.py"
    blocker.write_text("import sys\nclass _NoHorovod:\n    def find_spec(self, name, path=None, target=None):\n"
                       "        if name == 'horovod':\n            raise ImportError('hidden by test')\n"
                       "sys.meta_path.insert(0, _NoHorovod())\n")
    env["PYTHONPATH"] = f"{tmp_path}:{env.get('PYTHONPATH', '')}"
    result = gpt2dist("doctor", "--no-gpu", "--params", REPO / "params.yaml", "--preset", "cpu", check=False, env=env)
    assert result.returncode == 2
    assert ("Horovod, needed by horovod-fp32-n1, horovod-fp32-n2, horovod-bf16-n1, horovod-bf16-n2: install it with "
            "containers/install_horovod.sh") in result.stderr
