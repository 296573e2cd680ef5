"""`gpt2dist tune` before anything is timed or run: how many candidates a budget holds, and bad input as one error
line (the tune itself: tests/pipeline/test_tune_in_pipeline.py)."""

from __future__ import annotations

import re

import pytest

from conftest import REPO
from gpt2dist.tune import BETWEEN_JOBS_S, first_round, within_budget

from reduced_study import UNJUDGED, copy_workflow, run

RUN_S = {"ddp": 10.0, "zero1": 12.0, "fsdp": 14.0, "tp": 30.0}


def test_a_budget_keeps_the_most_wanted_candidates_whose_first_round_fits():
    """Three runs each, with Snakemake's work between them: 20 s of room holds none, two candidates' first round
    (ddp and zero1: 3 x 24 s) is the least kept; the control, room for all, keeps all in their order."""
    wanted = list(RUN_S)
    assert first_round(["ddp"], RUN_S, 3) == 3 * (10.0 + BETWEEN_JOBS_S)
    everything = first_round(wanted, RUN_S, 3)
    assert within_budget(wanted, RUN_S, 3, everything) == wanted
    assert within_budget(wanted, RUN_S, 3, everything - 1) == ["ddp", "zero1", "fsdp"]
    two = first_round(["ddp", "zero1"], RUN_S, 3)
    assert within_budget(wanted, RUN_S, 3, two) == ["ddp", "zero1"]
    assert within_budget(wanted, RUN_S, 3, two - 1) == []
    assert within_budget(["tp"], RUN_S, 3, 200) == ["tp"]  # one wanted: one measured


def tune(work, *args: str, check: bool = True):
    stored = [arg for name in ("cpu-study", "two-node-cpu", "two-node-splits-cpu")
              for arg in ("--study", str(REPO / "docs" / "reference" / name))]
    return run(["gpt2dist", "tune", "--nproc", "2", *stored, *args], work, check=check)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_budget_too_small_for_two_candidates_says_what_would_do_and_runs_nothing(tmp_path):
    """Planned only: single timed, the short list priced, and a budget that holds no first round of the two most
    wanted candidates refused, naming the budget that would; the control, a roomy budget, keeps all five."""
    work = copy_workflow(tmp_path, **UNJUDGED)
    among = ["--among", "ddp,zero1,fsdp,tp,zero2"]
    done = tune(work, "--dry-run", "--budget", "1s", *among, check=False)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert re.fullmatch(r"error: --budget 1s: the first round of \S+ and \S+ alone takes about [\d,]+ s here "
                        r"\(3 runs each, .* besides the runs, .* spent planning\); give --budget [\d,]+s or more",
                        lines[0]), lines
    roomy = tune(work, "--dry-run", "--replace", "--budget", "30m", *among)
    text = " ".join(roomy.stdout.split())
    assert "Measuring 5 of the 5 splits" in text and "left out for the budget" not in text, text
    assert "dry run: nothing measured" in text and not (work / "results" / "tune" / "results" / "runs").exists()


@pytest.mark.parametrize("args, message", [
    (["--budget", "0"], "error: --budget '0': give a time above 0 such as 20m, 600s or 1.5h"),
    (["--budget", "ten"], "error: --budget 'ten': give a time above 0"),
    (["--link-mbit", "200"], "error: --link-mbit shapes emulated nodes' links; add --emulate-nodes N"),
    (["--among", "ddp,bogus"], "error: --among bogus: unknown --strategy 'bogus'"),
    (["--gpus", "8", "--emulate-nodes", "2"], "error: --emulate-nodes and --link-mbit make nodes of this machine's"),
    (["--gpu", "H100"], "error: --gpu, --memory-gb and the links describe GPUs"),
    (["--nproc", "3", "--nodes", "2"], "error: 3 processes do not spread evenly over 2 node(s)"),
])
def test_bad_tune_input_is_one_error_line(args, message, tmp_path):
    work = copy_workflow(tmp_path, **UNJUDGED)
    done = tune(work, *args, check=False)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and lines[0].startswith(message), done.stderr
    assert not (work / "results" / "tune" / "summary.md").exists()


def test_a_previous_tune_is_replaced_only_when_asked(tmp_path):
    work = copy_workflow(tmp_path, **UNJUDGED)
    (work / "results" / "tune").mkdir(parents=True)
    (work / "results" / "tune" / "params.yaml").write_text("{}")
    done = tune(work, "--dry-run", check=False)
    assert done.returncode == 2 and done.stderr.strip() == (
        "error: results/tune holds a previous tune (or other files); give --replace to delete it and tune again, or "
        "--out another directory")
    assert (work / "results" / "tune" / "params.yaml").read_text() == "{}"
