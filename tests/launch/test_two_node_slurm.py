"""A study across nodes for real: a 2-node SLURM cluster on this machine (one slurmd inside each emulated node,
tests/slurm_cluster.py, with sshd on both for horovodrun), and a reduced study planned on this host, which is
no node, with `--config nodes=2` and run by `snakemake --profile` with the repository's SLURM profile. ddp
and horovod, one strategy per way of starting ranks on several nodes, train on one node and across both: each
2-node run is one 2-node job whose `gpt2dist train --nodes 2` starts srun + torchrun on both nodes (ddp; every
torchrun strategy starts so, and each one's 2-node losses are checked on emulated nodes in
test_emulated_nodes.py) or horovodrun over ssh (horovod, built here without MPI), and follows the one-node
run's losses; collect compares one node with two for each strategy.

Needs root, Debian's slurm-wlm and munge, iproute2 and openssh-server; .ci/run installs them and sets
GPT2DIST_REQUIRE_SLURM=1 and GPT2DIST_REQUIRE_NODES=1, so there (with either) a missing piece fails instead
of skipping.
"""

from __future__ import annotations

import json

import pandas as pd
import pytest

from gpt2dist.launch import emulated_nodes

import slurm_cluster
from conftest import require
from reduced_study import copy_workflow, run

pytestmark = pytest.mark.slow
STRATEGIES = ["ddp", "horovod"]
RUNS = [{"strategies": STRATEGIES, "precisions": ["fp32"], "nproc": [1]},
        {"strategies": STRATEGIES, "precisions": ["fp32"], "nproc": [2], "nodes": 2}]


def _unavailable() -> str | None:
    missing = slurm_cluster.missing_tools()
    if missing:
        return f"{', '.join(missing)} not installed (apt-get install slurm-wlm munge)"
    # root (slurmd starts jobs, and the nodes need it), ip, tc; sshd for horovodrun between the nodes
    return emulated_nodes.unavailable() or emulated_nodes.ssh_unavailable()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    require("GPT2DIST_REQUIRE_SLURM", "GPT2DIST_REQUIRE_NODES", missing=_unavailable())
    # sshd first: each slurmd sees the node's /etc/ssh as it was when it started
    with emulated_nodes.emulated_nodes(2) as made, emulated_nodes.ssh_between(made):
        started = slurm_cluster.start(tmp_path_factory.mktemp("slurm2"), emulated=made)
        try:
            yield started, made
        finally:
            slurm_cluster.stop(started)


@pytest.fixture(scope="module")
def study(cluster, tmp_path_factory):
    started, _ = cluster
    work = copy_workflow(tmp_path_factory.mktemp("two-node-study"), repeats=1, runs=RUNS)
    profile = slurm_cluster.edited_profile(work / "profile", started)
    done = run(["snakemake", "--profile", str(profile), "--config", "nodes=2"], work, check=False, env=started.env)
    if done.returncode:
        raise AssertionError(f"snakemake --profile (slurm) failed ({done.returncode}):\n{done.stderr[-6000:]}\n"
                             + started.log_tails())
    return work


def _record(study, run_id: str) -> dict:
    return json.loads((study / "results" / "runs" / run_id / "run.json").read_text())


@pytest.mark.timeout(1200)
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_each_strategy_trains_across_both_nodes_as_on_one(strategy, study):
    record = _record(study, f"{strategy}-fp32-n2-2nodes-r0")
    assert record["status"] == "completed" and record["placement"]["world_size"] == 2
    # a rank on each node, found by the ranks themselves, and the link between them measured
    assert [node["host"] for node in record["node_hardware"]] == ["node1", "node2"], record["node_hardware"]
    assert [node["ranks"] for node in record["node_hardware"]] == [1, 1]
    assert record["interconnect"]["busbw_gb_s"] > 0 and record["interconnect"]["bytes"] == 4 << 20
    launch = record["slurm_launch"]
    assert launch["nodes"] == ["node1", "node2"] and launch["ranks_per_node"] == 1, launch
    if strategy == "horovod":  # chosen and said, not guessed: Horovod here has Gloo and no MPI
        assert launch["horovod_launch"] == "horovodrun over ssh" and "without MPI" in launch["horovod_launch_why"]
        assert "horovodrun -np 2 -H node1:1,node2:1 --gloo" in record["launch_command"]
    else:
        assert record["launch_command"].startswith("srun --nodes=2 --ntasks-per-node=1")
        assert "--rdzv-endpoint=node1:" in record["launch_command"]
    # the same global batch on 2 processes follows 1 process's curve (fp32, the equivalence tests' tolerance)
    steps = pd.read_csv(study / "results" / "metrics.csv").set_index(["run_id", "step"])["loss"]
    one, two = steps[f"{strategy}-fp32-n1-r0"], steps[f"{strategy}-fp32-n2-2nodes-r0"]
    assert list(two.index) == list(one.index)
    assert ((two - one).abs() / one).max() <= 1e-5


@pytest.mark.timeout(1200)
def test_the_gradients_crossed_the_links_between_the_nodes(study, cluster):
    """Each node's link sent at least the modelled bytes of every step of every run that spanned both nodes
    (and more: start-up, evaluation, the selftests, headers)."""
    _, made = cluster
    spanning = [_record(study, f"{strategy}-fp32-n2-2nodes-r0") for strategy in STRATEGIES]
    steps = pd.read_csv(study / "results" / "metrics.csv").dropna(subset=["loss"]).groupby("run_id")["step"].size()
    modelled = sum(record["communication"]["bytes_per_step"] * steps[record["run_id"]] for record in spanning)
    sent = {node.name: node.interface_bytes()["tx_bytes"] for node in made.nodes}
    assert modelled > 0 and all(count >= modelled for count in sent.values()), (sent, modelled)


@pytest.mark.timeout(1200)
def test_every_job_ran_on_the_cluster_and_the_summary_compares_one_node_with_two(study, cluster):
    started, _ = cluster
    summary = json.loads((study / "results" / "summary.json").read_text())
    for strategy in STRATEGIES:
        across = summary["configs"][f"{strategy}-fp32-n2-2nodes"]
        assert across["nodes"] == 2 and across["emulated"] is False and across["baseline"] == f"{strategy}-fp32-n1"
        assert across["speedup"] > 0 and across["busbw_gb_s"] > 0
    places = [group["placement"] for group in summary["answer"]]
    assert "2 processes on 2 nodes" in places and "1 process on one machine" in places
    markdown = (study / "results" / "summary.md").read_text()
    assert "| 2 nodes, " in markdown and "GB/s busbw" in markdown
    # the across-nodes claims judge these runs (undisturbed ones: the two nodes share this machine's cores, so
    # runs spanning both are often starved and flagged), never emulated links
    claims = {finding["claim"]: finding for finding in summary["findings"]}
    for claim in ("bai-horovod-apex-robust", "bai-sublinear-nodes"):
        statistic = claims[claim]["statistic"]
        assert "across" in statistic and "emulated" not in statistic and "Mbit/s" not in statistic, claims[claim]
    # prepare, a selftest and a run per configuration, each an sbatch job that completed; the 2-node ones on 2,
    # through the rule that keeps them on the host under --sdm apptainer (workflow/rules/train.smk)
    jobs = slurm_cluster.jobs(started)
    rules = sorted(job["comment"].split("_wildcards_")[0] for job in jobs)
    assert rules == ["rule_prepare"] + ["rule_selftest"] * 4 + ["rule_train"] * 2 + ["rule_train_across_nodes"] * 2, \
        jobs
    assert {job["state"] for job in jobs} == {"COMPLETED"}
    assert sorted(job["nodes"] for job in jobs if job["comment"].startswith("rule_train")) == ["1"] * 2 + ["2"] * 2
