"""bench/gpu_campaign.sh on a machine without a GPU: its dry run goes through every step with the CPU
stand-ins and the same bookkeeping; a call that runs out of its budget stops with status 3 and the next
call goes on where it stopped; a step that fails is named and not recorded as done. And the one-GPU study
it runs (preset gpu-1gpu) is exactly the paper study's one-GPU configurations."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO
from gpt2dist.pipeline.study import configurations, plan_study

CAMPAIGN = REPO / "bench" / "gpu_campaign.sh"
STEPS = ["install", "doctor", "selftest", "study", "bundle", "mfu", "tests", "memory", "mfu_tf32"]


def campaign(*args: str, timeout: float = 400) -> subprocess.CompletedProcess:
    """As a user runs it, with this environment active (its python and gpt2dist on PATH)."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "PYTHON": sys.executable}
    return subprocess.run(["bash", str(CAMPAIGN), *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout)


def done(state: Path) -> list[str]:
    return [step for step in STEPS if (state / "done" / step).is_file()]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_dry_run_stops_at_its_budget_and_the_next_call_finishes_it(tmp_path):
    state, wheels = tmp_path / "state", ["--wheels", str(tmp_path / "no-wheels")]  # not this checkout's, if any
    first = campaign("--dry-run", "--state", str(state), *wheels, "--budget-s", "3")
    assert first.returncode == 3, first.stdout + first.stderr
    assert "run the same command again to go on" in first.stdout
    finished_first = done(state)
    assert finished_first and finished_first != STEPS, finished_first  # some, not all: the budget stopped it
    second = campaign("--dry-run", "--state", str(state), *wheels, "--budget-s", "500")
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    for step in finished_first:  # not run twice
        assert f"campaign: {step} done earlier" in second.stdout
    assert done(state) == STEPS
    assert "campaign: every step done" in second.stdout
    logs = {step: (state / "logs" / f"{step}.log").read_text() for step in STEPS if step not in finished_first}
    if "study" in logs:  # Snakemake planned the one-GPU study: a selftest per configuration, a train job per run
        assert "selftest" in logs["study"] and "train" in logs["study"], logs["study"][-2000:]


def test_a_failing_step_is_named_and_not_recorded_as_done(tmp_path):
    """Wheels whose checksums do not match stop the install, which a rerun then tries again."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "apex-0.1-cp312-cp312-linux_x86_64.whl").write_bytes(b"not a wheel")
    (wheels / "SHA256SUMS").write_text(f"{'0' * 64}  apex-0.1-cp312-cp312-linux_x86_64.whl\n")
    state = tmp_path / "state"
    result = campaign("--state", str(state), "--wheels", str(wheels), "--budget-s", "60", timeout=120)
    assert result.returncode == 1
    assert f"error: campaign step install failed (exit 1); its log: {state}/logs/install.log" in result.stderr
    assert done(state) == []


@pytest.mark.parametrize("args, message", [
    (["--budget-s", "0"], "error: --budget-s must be a whole number of seconds above 0, not '0'"),
    (["--budget-s", "nan"], "error: --budget-s must be a whole number of seconds above 0, not 'nan'"),
    (["--frobnicate"], "error: unknown option '--frobnicate'"),
])
def test_bad_options_get_one_error_line(args, message, tmp_path):
    result = campaign(*args, "--state", str(tmp_path / "state"), timeout=60)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [message + (" (see bench/gpu_campaign.sh --help)"
                                                             if "unknown" in message else "")]


def test_the_one_gpu_study_is_the_paper_studys_one_gpu_configurations():
    def configs(preset):
        return sorted((run.strategy, run.precision, run.nproc)
                      for run in configurations(plan_study(REPO / "params.yaml", preset, 1)))

    paper = configs("paper")
    assert configs("gpu-1gpu") == paper
    # Apex (O1 in ddp and horovod, apex-ddp's O2) and Horovod are among them: what has never run on a GPU
    assert {("apex-ddp", "apex-O2", 1), ("horovod", "apex-O1", 1), ("horovod", "bf16", 1)} <= set(paper)
