"""The multi-node cluster path for real: a 2-node SLURM cluster on this machine (one slurmd per emulated
node, tests/slurm_cluster.py), and an `sbatch -N 2` job whose `gpt2dist train` reads the allocation and
starts srun + torchrun over both nodes with a c10d rendezvous on node1, as on a real cluster. Its
per-step losses must equal the same ddp run on one machine, and its gradients must cross the link.

Needs root, Debian's slurm-wlm and munge, and iproute2; .ci/run installs them and sets
GPT2DIST_REQUIRE_SLURM=1 and GPT2DIST_REQUIRE_NODES=1, so there (with either) a missing piece fails instead
of skipping.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from gpt2dist.launch import emulated_nodes

import slurm_cluster
from conftest import read_metrics, require, run_record, train_args

pytestmark = pytest.mark.slow
TIMEOUT_S = 300


def _unavailable() -> str | None:
    missing = slurm_cluster.missing_tools()
    if missing:
        return f"{', '.join(missing)} not installed (apt-get install slurm-wlm munge)"
    return emulated_nodes.unavailable()  # root (slurmd starts jobs, and the nodes need it), ip, tc


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    require("GPT2DIST_REQUIRE_SLURM", "GPT2DIST_REQUIRE_NODES", missing=_unavailable())
    with emulated_nodes.emulated_nodes(2) as made:
        started = slurm_cluster.start(tmp_path_factory.mktemp("slurm2"), emulated=made)
        try:
            yield started, made
        finally:
            slurm_cluster.stop(started)


def test_sbatch_on_two_nodes_trains_as_one_machine_does(cluster, trained, shards, params_file, tmp_path):
    started, made = cluster
    one_machine, two_nodes = trained("ddp", nproc=2), tmp_path / "two"
    script = tmp_path / "job.sh"
    train = " ".join(map(str, [sys.executable, "-m", "gpt2dist", *train_args(shards, params_file, two_nodes, "ddp",
                                                                             nproc=2)]))
    script.write_text(f"#!/bin/sh\nexec {train}\n")
    sent_before = {node.name: node.interface_bytes()["tx_bytes"] for node in made.nodes}
    job = subprocess.run(["sbatch", "--wait", "--nodes=2", "--ntasks-per-node=1", f"--output={tmp_path / 'job.log'}",
                          f"--chdir={tmp_path}", str(script)], env=started.env, capture_output=True, text=True,
                         timeout=TIMEOUT_S)
    log = (tmp_path / "job.log").read_text() if (tmp_path / "job.log").exists() else ""
    assert job.returncode == 0, f"{job.stderr}\n{log[-4000:]}\n{started.log_tails()}"

    assert "starting the ranks: srun --nodes=2 --ntasks-per-node=1" in log and "--rdzv-endpoint=node1:" in log, log
    record = run_record(two_nodes)
    assert record["status"] == "completed" and record["placement"]["world_size"] == 2
    assert record["distributed"]["slurm"]["SLURM_NNODES"] == "2", record["distributed"]["slurm"]
    # rank 0 (it writes run.json) ran on node1, and each node's slurmd started its task of the job's step
    assert record["devices"]["hostname"] == "node1", record["devices"]
    step = f"launch task StepId={record['distributed']['slurm']['SLURM_JOB_ID']}.0 "
    for node in made.nodes:
        slurmd_log = (started.root / "log" / f"slurmd-{node.name}.log").read_text()
        assert step in slurmd_log, f"{node.name} started no task of the step:\n{slurmd_log[-2000:]}"
    expected, got = read_metrics(one_machine), read_metrics(two_nodes)
    assert [line["step"] for line in got] == [line["step"] for line in expected]
    worst = max(abs(a["loss"] - b["loss"]) / a["loss"] for a, b in zip(expected, got))
    assert worst <= 1e-6, f"ddp over two SLURM nodes left the one-machine losses by {worst:.2e}"
    # each node's rank sent its share of every step's gradient all-reduce over its own link
    modelled = record["communication"]["bytes_per_step"] * len(got)
    sent = {node.name: node.interface_bytes()["tx_bytes"] - sent_before[node.name] for node in made.nodes}
    assert all(count >= modelled for count in sent.values()), (sent, modelled)
