"""The image recipe and the environment check: lint, one recipe, containers on every rule, doctor."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from gpt2dist.config.presets import load_params
from gpt2dist.pipeline.study import plan_study

from conftest import REPO, gpt2dist

DOCKERFILE = REPO / "containers" / "Dockerfile"


def test_hadolint_finds_no_errors():
    hadolint = shutil.which("hadolint") or str(Path(sys.executable).with_name("hadolint"))
    recipes = [DOCKERFILE, *sorted((REPO / "containers" / "standin").glob("*Containerfile"))]
    assert len(recipes) == 3
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
    runs = len(plan_study(load_params(REPO / "params.yaml"), "cpu", 0).runs)
    assert f"ok: everything preset 'cpu' ({runs} runs) needs is here" in result.stdout


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


def _train_rules(deployment: set) -> dict:
    """The workflow's train rules as Snakemake loads them for the paper study on 2 nodes of 8 GPUs."""
    from snakemake.api import SnakemakeApi
    from snakemake.settings.enums import Quietness
    from snakemake.settings.types import ConfigSettings, DeploymentSettings, OutputSettings, ResourceSettings

    with SnakemakeApi(OutputSettings(quiet={Quietness.ALL})) as api:
        workflow = api.workflow(resource_settings=ResourceSettings(cores=1), snakefile=REPO / "Snakefile",
                                workdir=REPO, deployment_settings=DeploymentSettings(deployment_method=deployment),
                                config_settings=ConfigSettings(config={"preset": "paper", "gpus_per_node": 8,
                                                                       "nodes": 2}))
        rules = {rule.name: rule for rule in workflow._workflow.rules if rule.name.startswith("train")}
        return {name: (rule.container_img, re.compile(rule.wildcard_constraints["run"]), rule.params)
                for name, rule in rules.items()}


def test_under_apptainer_a_run_across_nodes_runs_on_the_host_and_srun_puts_its_tasks_in_the_image():
    """srun is not in the image, so a job that --sdm apptainer ran inside it could not start ranks on other
    nodes; the one-node runs stay in the image. Without --sdm apptainer no job names an image."""
    from snakemake.settings.types import DeploymentMethod

    image = yaml.safe_load((REPO / "params.yaml").read_text())["container"]
    rules = _train_rules({DeploymentMethod.APPTAINER})
    (inside, one_node, params), (host, across, _) = rules["train"], rules["train_across_nodes"]
    assert inside == image and host is None
    assert across.fullmatch("ddp-bf16-n8-2nodes-r0") and not one_node.fullmatch("ddp-bf16-n8-2nodes-r0")
    assert one_node.fullmatch("ddp-bf16-n8-r0") and not across.fullmatch("ddp-bf16-n8-r0")
    assert params.image(SimpleNamespace(run="ddp-bf16-n8-2nodes-r0")) == f"GPT2DIST_IMAGE={image} "
    assert params.image(SimpleNamespace(run="ddp-bf16-n8-r0")) == ""
    # the control: on the host (no --sdm), the runs across nodes name no image
    assert _train_rules(set())["train"][2].image(SimpleNamespace(run="ddp-bf16-n8-2nodes-r0")) == ""


def test_setup_env_makes_its_venv_with_the_faster_python(tmp_path):
    """pick_python.sh times each candidate on one probe and prints the faster: here the same interpreter twice,
    one of them under a trace function that runs on every line (several times slower), in both orders; a candidate
    that cannot make a venv is passed over, and with none left one error line and a failure."""
    real = Path(sys.executable).resolve()
    candidates = {
        "plain": f'exec "{real}" "$@"',
        "traced": f'exec "{real}" -c "import sys; sys.settrace(lambda *a: lambda *b: None); exec(sys.stdin.read())"',
        "unusable": "exit 1",
    }
    for name, line in candidates.items():
        (tmp_path / name).write_text(f"#!/bin/sh\n{line}\n")
        (tmp_path / name).chmod(0o755)

    def pick(*names: str) -> subprocess.CompletedProcess:
        env = {**os.environ, "PYTHON_CANDIDATES": " ".join(str(tmp_path / name) for name in names)}
        return subprocess.run(["bash", str(REPO / "containers" / "pick_python.sh")], env=env, capture_output=True,
                              text=True, timeout=120)

    for order in (("plain", "traced", "unusable"), ("unusable", "traced", "plain")):
        picked = pick(*order)
        assert picked.returncode == 0 and picked.stdout.strip() == str(tmp_path / "plain"), picked.stderr
        assert picked.stderr.count("s on the probe") == 2, picked.stderr  # the unusable one is not timed
    alone = pick("traced")  # the control: the traced one is taken where it is the only one
    assert alone.returncode == 0 and alone.stdout.strip() == str(tmp_path / "traced"), alone.stderr
    none = pick("unusable")
    assert none.returncode == 1 and none.stdout == "" and none.stderr.strip().startswith("error: no Python 3.10")
    assert len(none.stderr.strip().splitlines()) == 1
