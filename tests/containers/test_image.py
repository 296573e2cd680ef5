"""The image built and run for real: containers/Dockerfile with VARIANT=cpu, on the stand-in for
NGC's base (containers/standin/: Debian 13, GCC 14, Python 3.13, torch 2.8.0 and a pip constraint
file), by podman with runc. Inside it the selftest passes for every strategy, the reduced study
gives the host's numbers, and the tests of the torch.distributed paths pass on the base's torch.

Needs root, podman, runc and mmdebstrap; .ci/run installs them and sets GPT2DIST_REQUIRE_IMAGE=1,
so there a missing piece fails instead of skipping. Leave these out by hand with -m "not image".
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpt2dist.config.presets import load_params
from gpt2dist.pipeline.study import plan_study
from gpt2dist.system.conditions import QUIET_WAIT_ENV

from conftest import REPO, quiet_wait_for_studies, require
from reduced_study import assert_same_training_numbers, copy_workflow

pytestmark = [pytest.mark.slow, pytest.mark.image, pytest.mark.timeout(3600)]

TAG = "localhost/gpt2dist-test:cpu"
# What these machines need of podman: crun refuses their hybrid cgroups (runc does not), nothing
# delegates cgroups to the engine, and the default ulimits cannot be raised.
CONTAINERS_CONF = '[containers]\ndefault_ulimits = []\n[engine]\ncgroup_manager = "cgroupfs"\nruntime = "runc"\n'


def _unavailable() -> str | None:
    missing = [tool for tool in ("podman", "runc", "mmdebstrap") if shutil.which(tool) is None]
    if missing:
        return f"{', '.join(missing)} not installed (apt-get install podman runc mmdebstrap)"
    if os.geteuid() != 0:
        return "mmdebstrap and podman's runc setup here need root"
    return None


@dataclass(frozen=True)
class Image:
    tag: str
    base: str
    labels: dict[str, str]
    env: dict[str, str]
    build_seconds: float


@pytest.fixture(scope="module")
def podman_env(tmp_path_factory) -> dict[str, str]:
    require("GPT2DIST_REQUIRE_IMAGE", missing=_unavailable())
    conf = tmp_path_factory.mktemp("podman") / "containers.conf"
    conf.write_text(CONTAINERS_CONF)
    return {**os.environ, "CONTAINERS_CONF": str(conf)}


def _checked(cmd: list[str], env: dict[str, str], timeout: float) -> str:
    result = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    if result.returncode:
        raise AssertionError(f"{' '.join(cmd)} failed ({result.returncode}):\n{result.stdout[-3000:]}\n"
                             f"{result.stderr[-6000:]}")
    return result.stdout


@pytest.fixture(scope="module")
def cpu_image(podman_env) -> Image:
    """The stand-in base (from its cache when its recipe is unchanged), then the cpu variant."""
    started = time.monotonic()
    base = _checked(["bash", "containers/standin/build.sh"], podman_env, 3000).strip().splitlines()[-1]
    _checked(["bash", "containers/build_image.sh", "--variant", "cpu", "--base", base, "--tag", TAG], podman_env,
             3000)
    inspected = json.loads(_checked(["podman", "image", "inspect", TAG], podman_env, 60))[0]
    return Image(TAG, base, inspected["Labels"] or {}, podman_env, time.monotonic() - started)


def in_image(image: Image, script: str, *, mounts: dict[Path, str] = {}, check: bool = True,
             timeout: float = 1800) -> subprocess.CompletedProcess:
    """Run a bash script in a fresh container of the image, removed afterwards even on a timeout."""
    name = f"gpt2dist-test-{uuid.uuid4().hex[:12]}"
    volumes = [arg for host, inside in mounts.items() for arg in ("-v", f"{host}:{inside}")]
    if os.path.isfile(os.environ.get("PIP_CERT", "")):  # a proxy that re-signs TLS: pip needs its CA
        volumes += ["-v", f"{os.environ['PIP_CERT']}:/run/pip-ca.crt:ro", "-e", "PIP_CERT=/run/pip-ca.crt"]
    cmd = ["podman", "run", "--rm", "--name", name, "--network", "host", "-e", "CUDA_VISIBLE_DEVICES=", "-e", "COLUMNS=200",
           "-e", "PYTHONDONTWRITEBYTECODE=1", "-e", f"{QUIET_WAIT_ENV}={quiet_wait_for_studies()}", *volumes,
           image.tag, "bash", "-euo", "pipefail", "-c", script]
    try:
        result = subprocess.run(cmd, env=image.env, capture_output=True, text=True, timeout=timeout)
    finally:
        subprocess.run(["podman", "rm", "--force", "--ignore", name], env=image.env, capture_output=True)
    if check and result.returncode:
        raise AssertionError(f"in the image: {script}\nfailed ({result.returncode}):\n{result.stdout[-4000:]}\n"
                             f"{result.stderr[-6000:]}")
    return result


def test_the_cpu_variant_builds_on_the_constrained_standin_base(cpu_image):
    print(f"stand-in base and cpu image ready in {cpu_image.build_seconds:.0f} s")
    base_id = json.loads(_checked(["podman", "image", "inspect", cpu_image.base], cpu_image.env, 60))[0]["Id"]
    labels = cpu_image.labels
    assert labels["org.gpt2dist.variant"] == "cpu" and labels["org.gpt2dist.base.id"] == base_id, labels
    assert labels["org.opencontainers.image.base.name"] == cpu_image.base
    record = json.loads(in_image(cpu_image, "cat /opt/gpt2dist/image.json").stdout)
    assert record["content_id"] == labels["org.gpt2dist.content-id"] and record["base"]["id"] == base_id

    facts = json.loads(in_image(cpu_image, """
        gcc=$(gcc -dumpversion)
        base=$(/usr/bin/python -c 'import typing_extensions, importlib.metadata as m; print(m.version("typing-extensions"))')
        ours=$(python -c 'import importlib.metadata as m; print(m.version("typing-extensions"))')
        # the base enforces its constraint file: the lock's version cannot go into the base's Python
        refused=$(/usr/bin/python -m pip install --dry-run --no-deps "typing-extensions==$ours" >/dev/null 2>&1 \
                  && echo no || echo yes)
        python - <<PY
import json, torch, horovod.torch as hvd
print(json.dumps({"gcc": "$gcc", "base": "$base", "ours": "$ours", "refused": "$refused", "torch": torch.__version__,
                  "gloo": hvd.gloo_built(), "mpi": hvd.mpi_built(), "python": __import__("sys").version}))
PY
    """).stdout.splitlines()[-1])
    assert facts["gcc"].startswith("14") and facts["python"].startswith("3.13"), facts
    assert facts["torch"].startswith("2.8.0") and facts["gloo"] and not facts["mpi"], facts
    assert facts["base"] != facts["ours"] and facts["refused"] == "yes", facts

    doctor = in_image(cpu_image, "gpt2dist doctor --no-gpu --params /opt/gpt2dist/params.yaml --preset cpu").stdout
    assert f"gpt2dist cpu image {labels['org.gpt2dist.content-id'][:19]}" in doctor, doctor
    runs = len(plan_study(load_params(REPO / "params.yaml"), "cpu", 0).runs)
    assert f"ok: everything preset 'cpu' ({runs} runs) needs is here" in doctor, doctor


# bf16 for the strategies the reduced study leaves out (it trains single and ddp in fp32, without
# selftest jobs: its runs are theirs), at their largest process count. The whole cpu matrix (21 checks,
# about 7 minutes on 2 cores) is run by hand: containers/README.md has its last result.
SELFTEST_ONLY = ["dp-bf16-n1", "fsdp-bf16-n2", "horovod-bf16-n2"]


def test_selftest_and_reduced_study_inside_give_the_hosts_numbers(cpu_image, finished_study, tmp_path):
    work = copy_workflow(tmp_path, repeats=1, selftests=False)  # each run is compared with the host's first repeat
    only = " ".join(f"--only {config}" for config in SELFTEST_ONLY)
    in_image(cpu_image, f"cd /study && gpt2dist selftest --params /opt/gpt2dist/params.yaml --preset cpu {only} "
             "--out /study/selftest.json && snakemake --cores 2", mounts={work: "/study"})
    selftest = json.loads((work / "selftest.json").read_text())
    assert [check["name"] for check in selftest["checks"] if check["ok"]] == SELFTEST_ONLY, selftest
    # the same text tokenizes to the same shards on Python 3.13 as on the host's Python
    inside, host = (json.loads((study / "data/tokens/meta.json").read_text()) for study in (work, finished_study))
    assert inside["tokenizer"]["sha256"] == host["tokenizer"]["sha256"] and inside["splits"] == host["splits"]
    assert_same_training_numbers(work / "results", finished_study / "results", ["single-fp32-n1-r0", "ddp-fp32-n2-r0"])
    record = json.loads((work / "results" / "runs" / "ddp-fp32-n2-r0" / "run.json").read_text())
    assert record["image"]["content_id"] == cpu_image.labels["org.gpt2dist.content-id"], record["image"]
    assert record["versions"]["torch"].startswith("2.8.0"), record["versions"]
    assert (work / "results" / "summary.md").exists()


# The tests whose subject changes between torch releases: DTensor (FSDP2, tensor parallelism),
# torch.distributed.pipelining, distributed checkpoints and Horovod's torch ops.
ON_THE_IMAGES_TORCH = [
    *(f"tests/training/test_equivalence.py::test_two_ranks_follow_single_process[{s}]"
      for s in ("fsdp", "horovod", "tp", "pp")),
    "tests/training/test_train_cli.py::test_sigkill_then_rerun_resumes_to_the_same_state[fsdp-2-fp32]",
]


def test_the_torch_distributed_tests_pass_on_the_images_torch(cpu_image):
    """On the base's torch 2.8 and the image's Horovod build: fsdp, horovod, tp and pp follow the
    single-process run, and fsdp's sharded checkpoint resumes after SIGKILL to the same state. (ddp's
    equality with the host, and its resume, are checked by the study above; Horovod's checkpoint is
    rank 0's torch.save, as on the host; tp's goes through the same DTensor state-dict calls as fsdp's.)"""
    result = in_image(cpu_image, f"""
        # only the test runner: every library the tests import is the image's own
        PIP_CONSTRAINT="" python -m pip install --quiet --no-deps --target /tmp/test-tools \
          pytest pytest-timeout pluggy iniconfig
        cd /src && PYTHONPATH=/tmp/test-tools python -m pytest -o addopts= -q -p no:cacheprovider --durations=0 \
          {" ".join(map(shlex.quote, ON_THE_IMAGES_TORCH))}
    """, mounts={REPO: "/src:ro"}, check=False)
    print(result.stdout[-3000:])
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    assert re.search(rf"^{len(ON_THE_IMAGES_TORCH)} passed", result.stdout, re.M), result.stdout[-2000:]
