"""Two nodes for real on one machine (launch/emulated_nodes.py): network namespaces with their own
names and addresses, links shaped by tc, and the multi-node commands `gpt2dist train --hosts`
prints, started on each node: torchrun's c10d rendezvous for ddp and fsdp, horovodrun over ssh
for horovod. Each run's per-step losses must equal the same configuration's run on one machine.

Needs root, iproute2 and (for horovod) openssh-server; .ci/run installs them and sets
GPT2DIST_REQUIRE_NODES=1, so there a missing piece fails instead of skipping.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import pytest

from gpt2dist.config.strategies import describe
from gpt2dist.launch import emulated_nodes

from conftest import (REPO, Launch, assert_same_losses, gpt2dist, has_checkpoint, rank_report, read_metrics,
                      require, run_record, train_args)
from reduced_study import UNJUDGED, copy_workflow, run

pytestmark = pytest.mark.slow
TIMEOUT_S = 240


@pytest.fixture(scope="module", autouse=True)
def can_emulate():
    require("GPT2DIST_REQUIRE_NODES", missing=emulated_nodes.unavailable())


def needs_ssh(strategy: str) -> None:
    """horovodrun starts ranks on other nodes over ssh: without sshd such a case skips, naming it."""
    if describe(strategy).launcher == "horovodrun":
        require("GPT2DIST_REQUIRE_NODES", missing=emulated_nodes.ssh_unavailable())


def _ours(owner: int | None = None) -> set[str]:
    """Namespaces and links the emulation of `owner` (this process by default) has made and not removed."""
    tag = f"{emulated_nodes.PREFIX}{owner or os.getpid():x}-"
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
    names += subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout.split()
    return {name.rstrip(":").split("@")[0] for name in names if name.startswith(tag)}


def _send(sender: emulated_nodes.Node, receiver: emulated_nodes.Node, megabytes: int) -> float:
    """Mbit/s of a TCP transfer from one node to the other, timed by the receiver."""
    receive = ("import socket, time\nserver = socket.create_server(('0.0.0.0', 5001))\n"
               "connection, _ = server.accept()\nstart, total = time.monotonic(), 0\n"
               "while chunk := connection.recv(1 << 20):\n    total += len(chunk)\n"
               "print(total * 8 / 1e6 / (time.monotonic() - start))\n")
    send = (f"import socket, time\nfor _ in range(50):\n    try:\n        s = socket.create_connection(('{receiver.name}', 5001))\n"
            f"        break\n    except OSError:\n        time.sleep(0.1)\ns.sendall(b'x' * {megabytes << 20})\ns.close()\n")
    listener = subprocess.Popen(receiver.command([sys.executable, "-c", receive]), stdout=subprocess.PIPE, text=True)
    subprocess.run(sender.command([sys.executable, "-c", send]), check=True, timeout=60)
    return float(listener.communicate(timeout=60)[0])


def test_nodes_have_their_names_addresses_and_shaped_links():
    with emulated_nodes.emulated_nodes(2, link_mbit=100) as made:
        first, second = made.nodes
        names = subprocess.run(first.command(["sh", "-c", "hostname; getent hosts node2"]), capture_output=True,
                               text=True, check=True, timeout=30).stdout.split()
        assert names == ["node1", second.address, "node2"]
        assert _ours(), "the nodes should exist while the context is open"
        mbit = _send(first, second, megabytes=8)
        assert 60 < mbit < 110, f"a 100 Mbit/s link carried {mbit:.0f} Mbit/s"
        sent = first.interface_bytes()["tx_bytes"]
        assert sent >= 8 << 20, sent  # the link's counters saw the transfer
    assert not _ours(), "namespaces, veth links or the bridge outlived the context"
    assert not any(p.name.startswith(f"{emulated_nodes.PREFIX}{os.getpid():x}-") for p in emulated_nodes.NETNS_ETC.glob("*"))


def test_a_failure_inside_removes_everything():
    with pytest.raises(RuntimeError, match="inside"):
        with emulated_nodes.emulated_nodes(2):
            raise RuntimeError("a failure inside")
    assert not _ours()


@pytest.mark.parametrize("strategy", ["ddp", "fsdp", "horovod"])
def test_two_node_run_equals_the_one_machine_run(strategy, trained, shards, params_file, tmp_path):
    """The printed multi-node command, run on two emulated nodes, trains exactly as one machine does."""
    needs_ssh(strategy)
    one_machine, two_nodes = trained(strategy, nproc=2), tmp_path / "two"
    result = gpt2dist(*train_args(shards, params_file, two_nodes, strategy, "--emulate-nodes", "2", nproc=2),
                      timeout=TIMEOUT_S)
    assert_same_losses(one_machine, two_nodes)  # its control: tests/training/test_equivalence.py
    got = read_metrics(two_nodes)
    record = run_record(two_nodes)
    nodes = record["emulated_nodes"]
    assert record["status"] == "completed" and record["placement"]["world_size"] == 2
    command = next(iter(nodes["commands"].values()))
    assert ("--rdzv-endpoint=node1:" in command) if strategy != "horovod" else ("-H node1:1,node2:1" in command)
    # the gradients crossed the links: each node sent at least the modelled bytes of every step
    modelled = record["communication"]["bytes_per_step"] * len(got)
    assert all(counts["tx_bytes"] >= modelled for counts in nodes["link_bytes"].values()), (nodes, modelled)
    # gpt2dist's own error lines and Python tracebacks; torchrun may warn on its way out (the node that
    # closes the rendezvous last finds the first node's store gone), which is not the run's failure
    assert "Traceback (most recent call last)" not in result.stderr, result.stderr[-3000:]
    assert not [line for line in result.stderr.splitlines() if line.startswith("error:")], result.stderr[-3000:]


def test_a_stopped_run_leaves_no_node_behind(shards, params_file, tmp_path):
    """SIGTERM to `gpt2dist train` during a slow-link run: the ranks stop, the run says so, the nodes go."""
    out = tmp_path / "stopped"
    argv = [sys.executable, "-m", "gpt2dist", *map(str, train_args(shards, params_file, out, "ddp", "--emulate-nodes",
                                                                   "2", "--link-mbit", "20", "--max-steps", "200",
                                                                   nproc=2))]
    train = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + TIMEOUT_S
    while not (out / "metrics.jsonl").exists() or not read_metrics(out):
        assert train.poll() is None and time.monotonic() < deadline, train.stderr.read()[-3000:]
        time.sleep(0.5)
    train.send_signal(signal.SIGTERM)
    _, stderr = train.communicate(timeout=60)
    assert train.returncode == 128 + signal.SIGTERM, stderr[-3000:]
    assert stderr.strip().splitlines()[-1].startswith("error: interrupted by SIGTERM"), stderr[-2000:]
    assert json.loads((out / "run.json").read_text())["status"] == "interrupted"
    left = _ours(train.pid)
    assert not left, left


@pytest.mark.timeout(600)
@pytest.mark.parametrize("strategy", ["ddp", "horovod"])
def test_a_killed_launcher_leaves_no_rank_and_the_run_resumes(strategy, shards, params_file, tmp_path, launches):
    """SIGKILL to `gpt2dist train` of a two-node run. Nothing forwards a signal then: the kernel ends
    torchrun (horovodrun's helpers end its ssh sessions), and the ranks, on nodes with hostnames of
    their own, see their launcher gone and stop. The same command then clears the dead nodes and
    resumes from the last checkpoint."""
    needs_ssh(strategy)
    out = tmp_path / "killed"
    args = train_args(shards, params_file, out, strategy, "--emulate-nodes", "2", "--max-steps", "100000",
                      "--set", "train.checkpoint_interval=2", nproc=2)
    launch = Launch(args, out, tmp_path / "stderr.txt")
    launches.append(launch)
    launch.wait_for(has_checkpoint(out), timeout=TIMEOUT_S)
    ranks = [p for p in launch.family if p.cmdline()[1:-2] in (["-m"], ["-u", "-m"])
             and p.cmdline()[-2] == "gpt2dist.launch.worker"]  # python [-u] -m gpt2dist.launch.worker SPEC
    assert len(ranks) == 2, [p.cmdline() for p in launch.family]

    os.kill(launch.proc.pid, signal.SIGKILL)
    launch.proc.wait(timeout=60)
    survivors = launch.survivors(within_s=10)
    assert not survivors, f"still running 10 s after SIGKILL: {survivors}"

    # horovodrun's ssh keys, in the temporary directory, outlive the killed launcher (the control) until the next one
    keys = list(Path(tempfile.gettempdir()).glob(f"{emulated_nodes.SSH_KEYS}{launch.proc.pid:x}-*"))
    assert len(keys) == (strategy == "horovod"), keys
    saved = rank_report(out)["checkpoint_step"]
    gpt2dist(*train_args(shards, params_file, out, strategy, "--emulate-nodes", "2", "--max-steps", saved + 2,
                         "--set", "train.checkpoint_interval=2", nproc=2), timeout=TIMEOUT_S)
    record = run_record(out)
    assert record["status"] == "completed" and record["resumed_from_step"] == saved
    assert [line["step"] for line in read_metrics(out)] == list(range(saved + 2))
    left = _ours(launch.proc.pid)
    assert not left and not any(path.exists() for path in keys), (left, keys)


@pytest.mark.parametrize("args, message", [
    (["--link-mbit", "100"], "--link-mbit shapes emulated nodes' links; add --emulate-nodes N"),
    (["--emulate-nodes", "3"], "--emulate-nodes 3 must be 2 or more and divide --nproc 2"),
])
def test_emulation_mistakes_get_one_error_line(args, message, shards, params_file, tmp_path):
    result = gpt2dist(*train_args(shards, params_file, tmp_path / "run", "ddp", *args, nproc=2), check=False,
                      timeout=TIMEOUT_S)
    assert result.returncode == 2 and result.stderr.strip() == f"error: {message}", result.stderr
    assert not (tmp_path / "run" / "run.json").exists()


@pytest.mark.timeout(900)
def test_a_tune_on_two_emulated_nodes_places_what_sends_more_over_the_shaped_link_slower(tmp_path):
    """`gpt2dist tune --emulate-nodes 2 --link-mbit 10`: the tune's runs are emulated-node runs of its study (a node
    each for the two ranks, their link shaped), predicted with the link's bytes at its rate. On the tiny model the link
    decides the step: fsdp's gathers and reductions send more over it than ddp's all-reduce, and the tune places fsdp
    slower. The cause, modelled and measured: the bytes each run sends across, and those its link carried."""
    work = copy_workflow(tmp_path, **UNJUDGED)
    stored = [arg for name in ("cpu-study", "two-node-splits-cpu")
              for arg in ("--study", str(REPO / "docs" / "reference" / name))]
    done = run(["gpt2dist", "tune", "--nproc", "2", "--emulate-nodes", "2", "--link-mbit", "10", "--among", "ddp,fsdp",
                "--rounds", "1", "--budget", "12m", *stored], work)
    said = " ".join(done.stdout.split())
    assert "2 processes on 2 emulated nodes, 10 Mbit/s (CPUs)" in said and "across the emulated link" in said, said
    tune = work / "results" / "tune"
    runs = pd.read_csv(tune / "results" / "runs.csv").set_index("run_id")
    assert all(run_id.startswith(("ddp-fp32-n2-2nodes-10mbit-r", "fsdp-fp32-n2-2nodes-10mbit-r"))
               for run_id in runs.index)
    # the cause: fsdp's gathers and reduce-scatter send 2.5x ddp's all-reduce across (the traffic model), and its
    # link carried about that much more a step (beside what every run sends: its start, its probe, its evaluation)
    modelled = runs.groupby("strategy")["crossing_bytes_per_step"].median()
    measured = runs.groupby("strategy")["link_bytes_per_step"].median()
    assert modelled["fsdp"] > 2 * modelled["ddp"], modelled
    assert measured["fsdp"] - measured["ddp"] > 0.5 * (modelled["fsdp"] - modelled["ddp"]), (measured, modelled)
    summary = (tune / "summary.md").read_text()
    assert "**2 processes on 2 emulated nodes, 10 Mbit/s**: fastest is **ddp fp32**" in summary, summary[:3000]
    assert "fsdp fp32: " in summary and "slower, beyond the noise" in summary
