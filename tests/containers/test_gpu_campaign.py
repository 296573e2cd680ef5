"""bench/gpu_campaign.sh on a machine without a GPU: its dry run goes through every step with the CPU
stand-ins and the same bookkeeping; a call that runs out of its budget stops with status 3 and the next
call goes on where it stopped; a step that fails is named and not recorded as done. And the one-GPU study
it runs (preset gpu-1gpu: each strategy of the paper study on one GPU) is predicted to fit one call with its
install, and a dry run fails where it would not."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO
from gpt2dist.config.presets import load_params
from gpt2dist.pipeline.study import configurations, plan_study

CAMPAIGN = REPO / "bench" / "gpu_campaign.sh"
STEPS = ["install", "doctor", "selftest", "study", "bundle", "tune", "mfu", "tests", "memory", "mfu_tf32"]


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
    second = campaign("--dry-run", "--state", str(state), *wheels, "--budget-s", "600")
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    for step in finished_first:  # not run twice
        assert f"campaign: {step} done earlier" in second.stdout
    assert done(state) == STEPS
    assert "campaign: every step done" in second.stdout
    logs = {step: (state / "logs" / f"{step}.log").read_text() for step in STEPS if step not in finished_first}
    if "study" in logs:  # the planner's prediction, then Snakemake's plan: a train job per run, no selftest job
        assert "The study, one job at a time: about" in logs["study"], logs["study"][-2000:]
        assert "train" in logs["study"] and "selftest" not in logs["study"], logs["study"][-2000:]
    if "tune" in logs:  # the tune planned for one H100 within its budget, nothing run
        said = " ".join(logs["tune"].split())
        assert "tune: 1 node(s) of 1 H100 GPUs" in said and "Measuring " in said, said[-2000:]
        assert "dry run: nothing measured" in said and "budget of 4 min" in said, said[-2000:]


@pytest.mark.timeout(300)
def test_the_dry_run_fails_where_the_study_is_predicted_past_the_budget(tmp_path):
    """The study's call (install, study) must fit the budget by the planner's prediction for an H100, the model
    timed first included (the H200 took 540 s; the bundle may fall to the next call); the control: the same call
    with the campaign's default budget, 570 s, plans it."""
    wheels = ["--wheels", str(tmp_path / "no-wheels")]
    over = campaign("--dry-run", "--state", str(tmp_path / "over"), *wheels, "--steps", "study", "--budget-s", "300")
    assert over.returncode == 1 and "error: campaign step study failed" in over.stderr, over.stdout + over.stderr
    assert re.search(r"error: preset 'gpu-1gpu' is predicted to take [\d,]+ s on 1 H100 GPU\(s\), "
                     r"over --budget-s [23]\d\d", over.stdout), over.stdout[-2000:]
    fits = campaign("--dry-run", "--state", str(tmp_path / "fits"), *wheels, "--steps", "install,study,bundle",
                    "--budget-s", "570")
    assert fits.returncode == 0, fits.stdout[-3000:] + fits.stderr[-3000:]
    predicted = int(re.search(r"The study, one job at a time: about ([\d,]+) s", fits.stdout)[1].replace(",", ""))
    assert 540 <= predicted <= 570, fits.stdout[-2000:]


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


def test_the_one_gpu_study_is_every_strategy_of_the_paper_study_on_one_gpu():
    """Each strategy of the paper study's one-GPU configurations, in bf16 and at its Apex level, single in fp32 as
    the baseline; fp32 and tf32 beside single's are left out to fit one call (test above)."""
    def configs(preset):
        return {(run.strategy, run.precision, run.nproc)
                for run in configurations(plan_study(load_params(REPO / "params.yaml"), preset, 1))}

    paper, one_gpu = configs("paper"), configs("gpu-1gpu")
    assert one_gpu <= paper and {s for s, _, _ in one_gpu} == {s for s, _, n in paper if n == 1}
    assert {(s, p) for s, p, _ in one_gpu if p not in ("fp32", "tf32")} == {
        (s, p) for s, p, n in paper if n == 1 and p not in ("fp32", "tf32")}  # every bf16 and Apex one
    assert ("single", "fp32", 1) in one_gpu and not plan_study(load_params(REPO / "params.yaml"), "gpu-1gpu", 1).preset.study.selftests
    # Apex (O1 in ddp and horovod, apex-ddp's O2) and Horovod are among them: what has never run on a GPU
    assert {("apex-ddp", "apex-O2", 1), ("horovod", "apex-O1", 1), ("horovod", "bf16", 1)} <= one_gpu
