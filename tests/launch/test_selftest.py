"""`gpt2dist selftest`: every configuration of a study for a few steps plus a resume per strategy,
run for real (each check a `gpt2dist train` subprocess), with a matrix of what works."""

from __future__ import annotations

import json

import pytest

from gpt2dist.launch.selftest import one_line, resume_cases
from gpt2dist.pipeline.study import plan_study

from conftest import REPO, gpt2dist

pytestmark = pytest.mark.slow


@pytest.mark.timeout(1500)
def test_the_cpu_matrix_passes(tmp_path):
    """What CI proves for every commit: every configuration of the cpu study, and every strategy's resume."""
    out = tmp_path / "selftest.json"
    result = gpt2dist("selftest", "--params", REPO / "params.yaml", "--preset", "cpu", "--out", out)
    study = plan_study(REPO / "params.yaml", "cpu", 0)
    report = json.loads(out.read_text())
    configurations = {run.config_id for run in study.runs}
    names = [check["name"] for check in report["checks"]]
    assert set(names) == configurations | {f"resume {run.config_id}" for run in resume_cases(study)}
    assert {name.split()[1].split("-")[0] for name in names if name.startswith("resume")} == \
        {"single", "dp", "ddp", "fsdp", "horovod"}
    assert report["failed"] == 0 and report["passed"] == len(names), report
    assert "ok: all" in result.stdout and "resume horovod-fp32-n2" in result.stdout


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


def test_the_error_line_is_the_root_cause():
    ranks = ("[1]<stderr>:Traceback (most recent call last):\n"
             "[1]<stderr>:TypeError: zero_grad() got an unexpected keyword argument 'set_to_none'\n"
             "[0]<stderr>:RuntimeError: Horovod has been shut down\n"
             "error: training failed (horovodrun exited with 1); the ranks' messages are above\n")
    assert one_line(ranks) == "TypeError: zero_grad() got an unexpected keyword argument 'set_to_none'"
    assert one_line("warning: x\nerror: unknown preset 'gpu'\n") == "error: unknown preset 'gpu'"
    assert one_line("") == "exited without a message"
