"""SLURM launch commands for one allocation of 2 nodes x 8 GPUs, and for one node whose
tasks are the ranks (built, not run: tests/launch/test_slurm_cluster.py runs them)."""

import os
import shutil
import sys
from pathlib import Path

import pytest

from gpt2dist.config.strategies import STRATEGIES
from gpt2dist.errors import UsageError
from gpt2dist.launch.slurm import Container, container_from_env, horovod_launch, launch_command, srun_command
from gpt2dist.pipeline.jobs import slurm_request
from gpt2dist.pipeline.run import Run
from gpt2dist.pipeline.study import plan_study
from gpt2dist.config.presets import load_params
from gpt2dist.system.allocation import Allocation, job_allocation, parse_show_job, rendezvous_port

from conftest import REPO, gpt2dist, require

SPEC = Path("/scratch/results/runs/ddp-bf16-n16-r0/spec.json")
SIF = Container("gpt2dist.sif")
SQUASH = Container("/scratch/gpt2dist.sqsh", "pyxis", "/scratch")
PYXIS = ["--container-image=/scratch/gpt2dist.sqsh", "--container-mounts=/scratch:/scratch", "--container-workdir=/scratch"]
ENV = {"SLURM_JOB_ID": "4242", "SLURM_NNODES": "2", "SLURM_JOB_NODELIST": "gpu[07-08]", "SLURM_NTASKS": "16",
       "SLURM_CPUS_PER_TASK": "12", "SLURM_GPUS_ON_NODE": "8"}
TWO_NODES = Allocation(["gpu07", "gpu08"], tasks=16, cpus_per_task=12, gpus_per_node=8)
# `scontrol show job --oneliner` of that job, as the Snakemake job step must read it (it hides SLURM_*)
SHOWN = ("JobId=4242 JobName=7f3e UserId=ana(1000) JobState=RUNNING Partition=gpu ReqNodeList=(null) "
         "ExcNodeList=(null) NodeList=gpu[07-08] BatchHost=gpu07 NumNodes=2 NumCPUs=192 NumTasks=16 CPUs/Task=12 "
         "ReqB:S:C:T=0:0:*:* TRES=cpu=192,mem=500G,node=2,billing=192,gres/gpu=16 Command=(null) WorkDir=/scratch")


def test_allocation_from_slurm_variables_or_scontrol():
    assert job_allocation(ENV) == TWO_NODES
    assert parse_show_job(SHOWN) == TWO_NODES
    assert parse_show_job(SHOWN.replace("gres/gpu=16", "gres/gpu:h100=16")) == TWO_NODES
    assert job_allocation({}) is None
    assert job_allocation({**ENV, "SLURM_STEP_ID": "0"}) is None  # a task of a step: ranks are started already
    with pytest.raises(UsageError, match="no running allocation"):
        parse_show_job("JobId=4242 JobState=PENDING NodeList= NumTasks=16")


def test_torchrun_over_two_nodes_inside_the_image():
    cmd = launch_command("torchrun", 16, TWO_NODES, SPEC, container=SIF, run_id="ddp-bf16-n16-r0")
    assert cmd == ["srun", "--nodes=2", "--ntasks-per-node=1", "--cpus-per-task=96", "--kill-on-bad-exit=1",
                   "apptainer", "exec", "--nv", "gpt2dist.sif", "torchrun", "--nnodes=2", "--nproc-per-node=8",
                   "--rdzv-backend=c10d", "--rdzv-endpoint=gpu07:29500", "--rdzv-id=ddp-bf16-n16-r0",
                   f"--log-dir={SPEC.parent / 'torchrun-logs'}", "-m", "gpt2dist.launch.worker", str(SPEC)]


def test_under_pyxis_srun_itself_starts_each_task_in_the_image():
    torchrun = launch_command("torchrun", 16, TWO_NODES, SPEC, container=SQUASH, run_id="ddp-bf16-n16-r0")
    assert torchrun[:4] == ["srun", *PYXIS] and torchrun[4:6] == ["--nodes=2", "--ntasks-per-node=1"]
    assert "apptainer" not in torchrun and torchrun[torchrun.index("--kill-on-bad-exit=1") + 1] == "torchrun"
    pmix = launch_command("horovodrun", 16, TWO_NODES, SPEC, container=SQUASH, horovod=horovod_launch(MPI_TYPES, True))
    assert pmix[:5] == ["srun", *PYXIS, "--mpi=pmix"] and pmix[-4:] == ["python", "-m", "gpt2dist.launch.worker", str(SPEC)]
    tasks = launch_command("torchrun", 2, Allocation(["cpu01"], tasks=2, cpus_per_task=4), SPEC, container=SQUASH)
    assert tasks == ["srun", *PYXIS, "--ntasks=2", "--cpus-per-task=4", "--kill-on-bad-exit=1", "python", "-m",
                     "gpt2dist.launch.worker", str(SPEC)]
    # horovodrun over ssh would have to start ranks inside the image on the other nodes: refused, saying why
    with pytest.raises(UsageError, match="pyxis cannot start inside the image: use GPT2DIST_CONTAINER_RUNTIME=apptainer"):
        launch_command("horovodrun", 16, TWO_NODES, SPEC, container=SQUASH, horovod=horovod_launch(NO_PMIX, True))


def test_the_container_comes_from_the_environment():
    assert container_from_env({}) is None
    assert container_from_env({"GPT2DIST_IMAGE": "gpt2dist.sif"}).wrapper() == ["apptainer", "exec", "--nv",
                                                                              "gpt2dist.sif"]
    pyxis = container_from_env({"GPT2DIST_IMAGE": "a.sqsh", "GPT2DIST_CONTAINER_RUNTIME": "pyxis"})
    assert pyxis.wrapper() == [] and pyxis.srun_options()[0] == "--container-image=a.sqsh"
    with pytest.raises(UsageError, match="GPT2DIST_CONTAINER_RUNTIME is 'docker'; use one of apptainer, pyxis"):
        container_from_env({"GPT2DIST_IMAGE": "a.sif", "GPT2DIST_CONTAINER_RUNTIME": "docker"})


def test_torchrun_over_two_nodes_on_the_host_is_this_environments():
    # a job's PATH need not hold the environment's bin (tests/launch/test_slurm_cluster.py runs it)
    cmd = launch_command("torchrun", 16, TWO_NODES, SPEC, run_id="ddp-bf16-n16-r0")
    assert cmd == ["srun", "--nodes=2", "--ntasks-per-node=1", "--cpus-per-task=96", "--kill-on-bad-exit=1",
                   sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=8",
                   "--rdzv-backend=c10d", "--rdzv-endpoint=gpu07:29500", "--rdzv-id=ddp-bf16-n16-r0",
                   f"--log-dir={SPEC.parent / 'torchrun-logs'}", "-m", "gpt2dist.launch.worker", str(SPEC)]


# what `srun --mpi=list` prints with and without the PMIx plugin
MPI_TYPES = "MPI plugin types are...\n\tnone\n\tcray_shasta\n\tpmi2\n\tpmix\nspecific pmix plugin versions available: pmix_v4\n"
NO_PMIX = "MPI plugin types are...\n\tnone\n\tpmi2\n"


def test_horovod_over_two_nodes_starts_with_pmix_where_slurm_and_horovod_both_can():
    pmix = horovod_launch(MPI_TYPES, mpi_built=True)
    assert pmix.via == "srun --mpi=pmix" and not pmix.use_horovodrun
    assert launch_command("horovodrun", 16, TWO_NODES, SPEC, horovod=pmix) == [
        "srun", "--mpi=pmix", "--nodes=2", "--ntasks-per-node=8", "--cpus-per-task=12", "--kill-on-bad-exit=1",
        sys.executable, "-m", "gpt2dist.launch.worker", str(SPEC)]


@pytest.mark.parametrize("listed, mpi_built, why, gloo", [
    (NO_PMIX, True, "srun --mpi=list shows no pmix plugin", False),
    (MPI_TYPES, False, "Horovod was built without MPI", True),
    (NO_PMIX, False, "srun --mpi=list shows no pmix plugin", True),
], ids=["mpi-without-pmix", "pmix-without-mpi", "neither"])
def test_horovod_over_two_nodes_otherwise_starts_with_horovodrun_over_ssh_and_says_why(listed, mpi_built, why, gloo):
    chosen = horovod_launch(listed, mpi_built)
    assert chosen.via == "horovodrun over ssh" and chosen.why.startswith(why) and chosen.gloo is gloo
    command = launch_command("horovodrun", 16, TWO_NODES, SPEC, horovod=chosen)
    assert command[1:5] == ["-np", "16", "-H", "gpu07:8,gpu08:8"] and command[0].endswith("horovodrun")
    assert ("--gloo" in command) is gloo and command[-4:] == [sys.executable, "-m", "gpt2dist.launch.worker", str(SPEC)]
    inside = srun_command("horovodrun", TWO_NODES, SPEC, container=SIF, horovod=chosen)
    assert inside[:5] == ["apptainer", "exec", "--nv", "gpt2dist.sif", "horovodrun"] and inside[-4] == "python"


def test_each_job_meets_at_a_port_of_its_own():
    """Two jobs sharing a node (two multi-node selftests, say) must not both rendezvous at one port."""
    assert rendezvous_port({"SLURM_JOB_ID": "4242"}) == 29742 != rendezvous_port({"SLURM_JOB_ID": "4243"})
    assert rendezvous_port({}) == 29500
    command = srun_command("torchrun", TWO_NODES, SPEC, port=rendezvous_port({"SLURM_JOB_ID": "4242"}))
    assert "--rdzv-endpoint=gpu07:29742" in command


def test_several_nodes_must_hold_exactly_the_ranks():
    with pytest.raises(UsageError, match="does not match the SLURM allocation of 2 nodes x 8 ranks"):
        launch_command("torchrun", 8, TWO_NODES, SPEC)
    with pytest.raises(UsageError, match="several nodes need one of ddp, horovod, fsdp, tp, pp, fsdp-tp, apex-ddp"):
        launch_command("python", 16, TWO_NODES, SPEC)


def test_one_node_whose_tasks_are_the_ranks():
    one_node = Allocation(["cpu01"], tasks=2, cpus_per_task=4)
    assert launch_command("torchrun", 2, one_node, SPEC, container=SIF) == [
        "srun", "--ntasks=2", "--cpus-per-task=4", "--kill-on-bad-exit=1",
        "apptainer", "exec", "--nv", "gpt2dist.sif", "python", "-m", "gpt2dist.launch.worker", str(SPEC)]
    # the local launcher otherwise: a job of one task, a single process, or horovodrun's own rendezvous
    assert launch_command("torchrun", 2, Allocation(["cpu01"], tasks=1, cpus_per_task=8), SPEC) is None
    assert launch_command("python", 1, Allocation(["cpu01"], tasks=1), SPEC) is None
    assert launch_command("horovodrun", 2, one_node, SPEC) is None


@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
def test_train_jobs_ask_for_one_task_per_process(strategy):
    """The train rule's `tasks`: a task per GPU, except dp, whose one process drives every GPU (and single's one)."""
    study = plan_study(load_params(REPO / "params.yaml"), "paper", 8)
    nproc = 1 if strategy == "single" else 4
    request = slurm_request(study, Run(strategy, "fp32", nproc, 0))
    assert (request["tasks"], request["gres"]) == ({"dp": 1}.get(strategy, nproc), f"gpu:{nproc}")
    assert request["mpi"] == ("srun" if request["tasks"] > 1 else "")


def _train_command_in_a_job(shards, params_file, out: Path, path: str) -> str:
    job = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "cpu01", "SLURM_NTASKS": "2", "SLURM_CPUS_PER_TASK": "3"}
    env = {**os.environ, **job, "PATH": path, "CUDA_VISIBLE_DEVICES": ""}
    return gpt2dist("train", "--data", shards, "--out", out, "--params", params_file, "--strategy", "ddp",
                    "--nproc", "2", "--print-command", env=env).stdout


def test_train_in_a_two_task_job_starts_its_ranks_with_srun(shards, params_file, tmp_path):
    require("GPT2DIST_REQUIRE_SLURM", missing=shutil.which("srun") is None and "needs SLURM's srun (apt-get install "
            "slurm-client)")
    shown = _train_command_in_a_job(shards, params_file, tmp_path / "run", os.environ["PATH"])
    assert shown.startswith("srun --ntasks=2 --cpus-per-task=3 --kill-on-bad-exit=1 ") and "gpt2dist.launch.worker" in shown


def test_train_without_srun_starts_its_ranks_on_this_node(shards, params_file, tmp_path):
    # an image without SLURM's commands, run by `snakemake --sdm apptainer` inside the job
    shown = _train_command_in_a_job(shards, params_file, tmp_path / "run", str(tmp_path))
    assert "forking_torchrun --standalone --nproc-per-node=2" in shown and shown.split()[0] != "srun"
