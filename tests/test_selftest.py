"""`gpt2dist selftest`: every configuration of a study for a few steps plus a resume per strategy,
run for real (each check a `gpt2dist train` subprocess), with a matrix of what works."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

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
    study = plan_study(every_strategy, None, 0)
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
def test_the_pipelines_job_checks_one_configuration_and_its_resume(params_file, tmp_path):
    out = tmp_path / "single.json"
    gpt2dist("selftest", "--params", params_file, "--only", "single-fp32-n1", "--resume", "--out", out)
    report = json.loads(out.read_text())
    assert [check["name"] for check in report["checks"]] == ["single-fp32-n1", "resume single-fp32-n1"]
    assert report["failed"] == 0, report
