"""`gpt2dist selftest`: every configuration of a study for a few steps plus a resume per strategy,
run for real (each check a `gpt2dist train` subprocess), with a matrix of what works."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from gpt2dist.config.presets import load_params
from gpt2dist.pipeline.study import plan_study, resume_cases

from conftest import gpt2dist

pytestmark = pytest.mark.slow


# The selftest of every strategy runs for real inside the image (tests/containers/test_image.py).
EVERY_STRATEGY = ["single-fp32-n1", "dp-fp32-n1", "ddp-fp32-n2", "fsdp-fp32-n2", "horovod-fp32-n2"]


@pytest.fixture(scope="module")
def every_strategy(params_file, tmp_path_factory) -> Path:
    """The tiny preset with a configuration of each strategy."""
    params = yaml.safe_load(params_file.read_text())
    params["presets"]["tiny"]["study"]["runs"] = [
        {"strategies": ["single", "dp"], "precisions": ["fp32"], "nproc": [1]},
        {"strategies": ["ddp", "fsdp", "horovod"], "precisions": ["fp32"], "nproc": [2]},
    ]
    path = tmp_path_factory.mktemp("every-strategy") / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    return path


def test_every_strategy_has_a_resume_case(every_strategy):
    study = plan_study(load_params(every_strategy), None, 0)
    assert sorted(run.config_id for run in resume_cases(study)) == sorted(EVERY_STRATEGY)


@pytest.mark.timeout(300)
def test_a_hung_configuration_fails_the_selftest_with_its_line(params_file, tmp_path):
    """Negative control: a check that does not finish in time is a failure, named, with the matrix written."""
    out = tmp_path / "selftest.json"
    result = gpt2dist("selftest", "--params", params_file, "--out", out, "--timeout", "0.5", check=False)
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and errors[0].startswith("error: selftest: 4 of 4 checks failed"), result.stderr
    report = json.loads(out.read_text())
    assert report["failed"] == 4 and all("no result within 0.5 s" in check["error"] for check in report["checks"])
    assert "failed" in result.stdout and "single-fp32-n1" in result.stdout


@pytest.mark.timeout(300)
def test_a_failed_check_leaves_the_output_that_led_to_its_error_in_the_log(params_file, tmp_path):
    """A launcher's complaint comes before the rank's error line (Open MPI's, seen on a GPU node): the table
    holds the error line, the log the lines before it. The failure is injected into the check's `gpt2dist
    train` alone, at interpreter start."""
    inject = tmp_path / "inject"
    inject.mkdir()
    (inject / "sitecustomize.py").write_text(
        "import os, sys\n"
        "if sys.orig_argv[1:4] == ['-m', 'gpt2dist', 'train']:\n"
        "    print('prterun was unable to find the specified executable file', file=sys.stderr)\n"
        "    print('error: training failed (horovodrun exited with 66)', file=sys.stderr, flush=True)\n"
        "    os._exit(1)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(inject), os.environ.get("PYTHONPATH", "")])}
    out = tmp_path / "single.json"
    result = gpt2dist("selftest", "--params", params_file, "--only", "single-fp32-n1", "--out", out, env=env,
                      check=False)
    assert result.returncode == 2
    assert json.loads(out.read_text())["checks"][0]["error"] == "error: training failed (horovodrun exited with 66)"
    before, after = result.stderr.split("--- single-fp32-n1: the last 2 lines of its output ---\n")
    assert after.startswith("prterun was unable to find the specified executable file\n"
                            "error: training failed (horovodrun exited with 66)\n"), result.stderr
    # control: without the injection the same check passes, and says nothing of its output
    passed = gpt2dist("selftest", "--params", params_file, "--only", "single-fp32-n1", "--out", out)
    assert "lines of its output" not in passed.stderr


@pytest.mark.timeout(300)
def test_the_pipelines_job_checks_one_configuration_and_its_resume(params_file, tmp_path):
    out = tmp_path / "single.json"
    gpt2dist("selftest", "--params", params_file, "--only", "single-fp32-n1", "--resume", "--out", out)
    report = json.loads(out.read_text())
    assert [check["name"] for check in report["checks"]] == ["single-fp32-n1", "resume single-fp32-n1"]
    assert report["failed"] == 0, report
