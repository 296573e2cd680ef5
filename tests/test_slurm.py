"""SLURM launch commands for one allocation of 2 nodes x 8 GPUs (built, not run)."""

from pathlib import Path

import pytest

from gpt2dist.errors import UsageError
from gpt2dist.slurm import Allocation, allocation_from_env, srun_command

SPEC = Path("/scratch/results/runs/ddp-bf16-n16-r0/spec.json")
ENV = {"SLURM_NNODES": "2", "SLURM_JOB_NODELIST": "gpu[07-08]", "SLURM_GPUS_ON_NODE": "8"}


def test_allocation_from_slurm_variables():
    assert allocation_from_env(ENV) == Allocation(["gpu07", "gpu08"], 8)
    assert allocation_from_env({**ENV, "SLURM_NNODES": "1"}) is None
    assert allocation_from_env({}) is None


def test_torchrun_over_two_nodes_inside_the_image():
    cmd = srun_command("torchrun", allocation_from_env(ENV), SPEC, image="gpt2dist.sif", run_id="ddp-bf16-n16-r0")
    assert cmd == ["srun", "--nodes=2", "--ntasks-per-node=1", "apptainer", "exec", "--nv", "gpt2dist.sif",
                   "torchrun", "--nnodes=2", "--nproc-per-node=8", "--rdzv-backend=c10d",
                   "--rdzv-endpoint=gpu07:29500", "--rdzv-id=ddp-bf16-n16-r0", "-m", "gpt2dist.worker", str(SPEC)]


def test_horovod_over_two_nodes():
    alloc = allocation_from_env(ENV)
    assert srun_command("horovodrun", alloc, SPEC) == [
        "srun", "--mpi=pmix", "--nodes=2", "--ntasks-per-node=8", "python", "-m", "gpt2dist.worker", str(SPEC)]
    assert srun_command("horovodrun", alloc, SPEC, use_horovodrun=True)[:5] == [
        "horovodrun", "-np", "16", "-H", "gpu07:8,gpu08:8"]


def test_single_process_strategies_refuse_several_nodes():
    with pytest.raises(UsageError, match="several nodes need ddp, fsdp or horovod"):
        srun_command("python", allocation_from_env(ENV), SPEC)
