"""The cluster path for real: a one-node SLURM cluster on this machine (slurm_cluster.py),
then `snakemake --profile` with the repository's SLURM profile (partition, account and sizes
edited as a user edits them) runs a reduced cpu study. Every rule but the localrules (collect,
plot, report) is an sbatch job; the 2-rank ddp runs start their ranks as the job's two SLURM
tasks through srun.

Needs Debian's slurm-wlm and munge and root (slurmd starts jobs); .ci/run installs them and
sets GPT2DIST_REQUIRE_SLURM=1, so there a missing piece fails instead of skipping.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from gpt2dist.results.plots import FIGURES

import slurm_cluster
from conftest import require
from reduced_study import BIN, REPO, assert_same_training_numbers, copy_workflow, run

pytestmark = pytest.mark.slow


def _unavailable() -> str | None:
    missing = slurm_cluster.missing_tools()
    if missing:
        return f"{', '.join(missing)} not installed (apt-get install slurm-wlm munge)"
    if os.geteuid() != 0:
        return "slurmd must run as root to start jobs"
    return None


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    require("GPT2DIST_REQUIRE_SLURM", missing=_unavailable())
    started = slurm_cluster.start(tmp_path_factory.mktemp("slurm"))
    yield started
    slurm_cluster.stop(started)


@pytest.fixture(scope="module")
def study_on_cluster(cluster, tmp_path_factory) -> Path:
    """The reduced study with one repeat (each run's numbers are compared with the local study's), without
    selftest jobs: test_two_node_slurm.py's study runs them as sbatch jobs, on one node and on two."""
    work = copy_workflow(tmp_path_factory.mktemp("cluster-study"), repeats=1, selftests=False)
    profile = slurm_cluster.edited_profile(work / "profile", cluster)
    result = run(["snakemake", "--profile", str(profile)], work, check=False, env=cluster.env)
    if result.returncode:
        raise AssertionError(f"snakemake --profile (slurm) failed ({result.returncode}):\n{result.stderr[-6000:]}\n"
                             + cluster.log_tails())
    return work


def test_every_cluster_rule_ran_as_a_completed_sbatch_job(study_on_cluster, cluster):
    jobs = slurm_cluster.jobs(cluster)
    rules = sorted(job["comment"].split("_wildcards_")[0] for job in jobs)
    # collect, plot and report are localrules: seconds of CPU on the submit host
    assert rules == ["rule_prepare"] + ["rule_train"] * 2, jobs
    assert {job["state"] for job in jobs} == {"COMPLETED"}


def test_ddp_ranks_were_the_jobs_two_slurm_tasks(study_on_cluster, cluster):
    runs = study_on_cluster / "results" / "runs"
    for run_id in ("ddp-fp32-n2-r0",):
        record = json.loads((runs / run_id / "run.json").read_text())
        slurm = record["distributed"]["slurm"]
        # rank 0 is task 0 of a job step (srun), in a job of two tasks; not a torchrun child
        assert record["status"] == "completed" and record["placement"]["world_size"] == 2, record
        assert slurm["SLURM_NTASKS"] == "2" and "SLURM_STEP_ID" in slurm, slurm
        log = (study_on_cluster / "logs" / "train" / f"{run_id}.log").read_text()
        assert "starting the ranks: srun --ntasks=2" in log and "gpt2dist.launch.worker" in log, log[-2000:]
    single = json.loads((runs / "single-fp32-n1-r0" / "run.json").read_text())
    assert single["status"] == "completed" and single["distributed"]["slurm"]["SLURM_JOB_ID"]


def test_figures_and_summary_come_out_as_locally(study_on_cluster, finished_study):
    """The same reduced study run locally: the same runs, figures and summary, and the same
    training numbers (srun-started ranks compute what torchrun-started ones do)."""
    results = {where: study / "results" for where, study in (("cluster", study_on_cluster), ("local", finished_study))}
    summaries = {where: json.loads((r / "summary.json").read_text()) for where, r in results.items()}
    assert set(summaries["cluster"]["configs"]) == set(summaries["local"]["configs"]) == {"single-fp32-n1", "ddp-fp32-n2"}
    assert summaries["cluster"]["configs"]["single-fp32-n1"]["speedup"] == pytest.approx(1.0)
    figures = {where: sorted(p.name for p in (r / "figures").iterdir()) for where, r in results.items()}
    assert figures["cluster"] == figures["local"] and len(figures["local"]) == 2 * len(FIGURES)  # png and svg
    for r in results.values():
        assert all((r / "figures" / name).stat().st_size > 1000 for name in figures["local"])
        assert "| ddp " in (r / "summary.md").read_text()
    assert_same_training_numbers(results["cluster"], results["local"], ["single-fp32-n1-r0", "ddp-fp32-n2-r0"])


def test_sbatch_job_of_two_tasks_runs_ddp_ranks_as_its_tasks(cluster, shards, params_file, tmp_path):
    """By hand, without Snakemake: the batch script keeps SLURM's variables, so the allocation
    comes from them rather than from scontrol."""
    out = tmp_path / "ddp"
    train = (f"gpt2dist train --data {shards} --out {out} --params {params_file} --strategy ddp --nproc 2 "
             "--max-steps 4")
    log = tmp_path / "job.log"
    result = subprocess.run(["sbatch", "--wait", "--ntasks=2", "--cpus-per-task=1", f"--output={log}",
                             f"--chdir={tmp_path}", "--wrap", train],
                            env={**cluster.env, "PATH": f"{BIN}:{os.environ['PATH']}", "CUDA_VISIBLE_DEVICES": ""},
                            capture_output=True, text=True, timeout=300)
    text = log.read_text() if log.exists() else ""
    assert result.returncode == 0, f"{result.stderr}\n{text[-3000:]}\n{cluster.log_tails()}"
    assert "starting the ranks: srun --ntasks=2 --cpus-per-task=1" in text, text[-3000:]
    record = json.loads((out / "run.json").read_text())
    assert record["status"] == "completed" and record["placement"]["world_size"] == 2
    assert record["distributed"]["slurm"]["SLURM_STEP_ID"] == "0"


def test_doctor_inside_a_job_shows_its_allocation_with_or_without_slurm_variables(cluster, tmp_path):
    doctor = f"gpt2dist doctor --no-gpu --params {REPO / 'params.yaml'} --preset cpu"
    # the second call sees what Snakemake's job step leaves: SLURM_JOB_ID alone, so scontrol answers
    script = (f"{doctor} && unset $(env | sed -n 's/^\\(SLURM_[A-Z_]*\\)=.*/\\1/p' | grep -vx SLURM_JOB_ID) "
              f"&& echo SLURM variables: $(env | grep -c ^SLURM_) && {doctor}")
    log = tmp_path / "doctor.log"
    result = subprocess.run(["sbatch", "--wait", "--ntasks=2", "--cpus-per-task=1", f"--output={log}",
                             f"--chdir={tmp_path}", "--wrap", script],
                            env={**cluster.env, "PATH": f"{BIN}:{os.environ['PATH']}"},
                            capture_output=True, text=True, timeout=300)
    text = log.read_text() if log.exists() else ""
    assert result.returncode == 0, f"{result.stderr}\n{text[-3000:]}"
    assert "SLURM variables: 1" in text
    assert text.count(f"1 node(s) {cluster.nodes[0]}, 2 tasks x 1 CPUs") == 2, text
