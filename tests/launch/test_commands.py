"""Launcher command lines, local and multi-node (built, not run: there is one machine here)."""

import sys
from pathlib import Path

import pytest

from gpt2dist.errors import UsageError
from gpt2dist.launch.commands import WORKER_FILE, launch_env, local_command, multinode_commands, parse_hosts

SPEC = Path("/runs/ddp-bf16-n16-r0/spec.json")
LOGS = "--log-dir=/runs/ddp-bf16-n16-r0/torchrun-logs"


def test_parse_hosts():
    hosts = parse_hosts("node1:8, node2:8")
    assert [(h.name, h.slots) for h in hosts] == [("node1", 8), ("node2", 8)]
    for bad in ("node1", "node1:x", "node1:0", ",", ":8"):
        with pytest.raises(UsageError):
            parse_hosts(bad)


def test_local_commands():
    assert local_command("python", 1, SPEC, "cpu") is None
    # on GPUs each rank is a fresh interpreter (no process that forks ranks may have touched CUDA)
    torchrun = local_command("torchrun", 2, SPEC, "cuda")
    assert torchrun[:3] == [sys.executable, "-m", "torch.distributed.run"] and "fork" not in " ".join(torchrun)
    assert torchrun[-3:] == ["-m", "gpt2dist.launch.worker", str(SPEC)]
    # on CPUs torchrun forks them, from a process that imported the worker, which each runs as a file
    forking = local_command("torchrun", 2, SPEC, "cpu")
    assert forking[:3] == [sys.executable, "-m", "gpt2dist.launch.forking_torchrun"]
    assert forking[-5:] == ["--start-method=fork", LOGS, "--run-path", str(WORKER_FILE), str(SPEC)]
    assert WORKER_FILE.is_file() and WORKER_FILE.read_text().startswith('"""Entry point of one training rank')
    for command in (torchrun, forking):
        assert "--standalone" in command and "--nproc-per-node=2" in command
        # torchrun's log directory in the run's, which the runner removes, not one more in /tmp for every launch
        # (tests/launch/test_temp_files.py)
        assert LOGS in command
    # Gloo's controller on CPUs and GPUs alike (horovodrun's mpirun line fails on Open MPI 5)
    assert local_command("horovodrun", 2, SPEC, "cpu")[1:6] == ["-np", "2", "-H", "localhost:2", "--gloo"]


def test_torchrun_two_nodes_by_eight_gpus():
    (where, cmd), = multinode_commands("torchrun", parse_hosts("gpu-a:8,gpu-b:8"), SPEC, run_id="ddp-bf16-n16-r0").items()
    assert where == "every node"
    assert cmd == ("torchrun --nnodes=2 --nproc-per-node=8 --rdzv-backend=c10d --rdzv-endpoint=gpu-a:29500 "
                   "--rdzv-id=ddp-bf16-n16-r0 --log-dir=/runs/ddp-bf16-n16-r0/torchrun-logs -m gpt2dist.launch.worker "
                   "/runs/ddp-bf16-n16-r0/spec.json")


def test_horovod_two_nodes_by_eight_gpus():
    cmds = multinode_commands("horovodrun", parse_hosts("gpu-a:8,gpu-b:8"), SPEC)
    assert cmds["gpu-a (horovodrun)"].startswith("horovodrun -np 16 -H gpu-a:8,gpu-b:8 --gloo python -m gpt2dist.launch.worker")
    mpirun = cmds["gpu-a (mpirun)"]
    assert mpirun.startswith("mpirun -np 16 -H gpu-a:8,gpu-b:8 --bind-to none --map-by slot")
    assert "-x NCCL_DEBUG=INFO" in mpirun and mpirun.endswith(str(SPEC))


def test_torchrun_refuses_uneven_nodes_and_single_process_strategies():
    with pytest.raises(UsageError, match="same number of processes"):
        multinode_commands("torchrun", parse_hosts("a:8,b:4"), SPEC)
    with pytest.raises(UsageError, match="--hosts needs one of ddp, horovod, fsdp, tp, pp, fsdp-tp, apex-ddp"):
        multinode_commands("python", parse_hosts("a:8,b:8"), SPEC)


def test_threads_are_split_between_ranks():
    snakemake_job = {"OMP_NUM_THREADS": "8", "MKL_NUM_THREADS": "8", "OPENBLAS_NUM_THREADS": "8"}  # threads: 8
    env = launch_env(2, snakemake_job, cores=64)
    assert env["OMP_NUM_THREADS"] == env["MKL_NUM_THREADS"] == env["OPENBLAS_NUM_THREADS"] == "4"
    assert launch_env(4, {"OMP_NUM_THREADS": "2"}, cores=64)["MKL_NUM_THREADS"] == "1"
    assert int(launch_env(1, {})["OMP_NUM_THREADS"]) >= 1


def test_thread_budget_is_capped_at_the_cores_this_process_may_use():
    # Snakemake's --cores all counts the whole node; a SLURM job may be bound to 8 of its cores
    assert launch_env(2, {"OMP_NUM_THREADS": "128"}, cores=8)["OMP_NUM_THREADS"] == "4"
    assert launch_env(2, {}, cores=8)["OMP_NUM_THREADS"] == "4"
