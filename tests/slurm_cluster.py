"""A throwaway SLURM cluster on this machine, for the tests of the cluster path: one node (this
host), or one slurmd per emulated node (gpt2dist.launch.emulated_nodes), each in its node's
network namespace with its own address and hostname, the controller on the bridge's address.

Debian's slurm-wlm and munge, each daemon in the foreground with its files (munge key and
socket, state, spool, logs) under one temporary directory and its own ports, so teardown
stops exactly the processes started here. Only slurm.conf lives at the system's path:
Snakemake's SLURM job step drops SLURM_CONF from the environment of the commands it runs,
so the srun it calls reads /etc/slurm/slurm.conf. An existing one that this module did not
write stops the fixture rather than being overwritten.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from gpt2dist.launch.emulated_nodes import EmulatedNodes
from gpt2dist.launch import lifetime

from conftest import REPO

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "srun", "squeue", "sinfo", "scancel")
PARTITION = "debug"
SYSTEM_CONF = Path("/etc/slurm/slurm.conf")
MARKER = "# written by gpt2dist's test cluster; removed when it stops\n"


def missing_tools() -> list[str]:
    return [tool for tool in (*DAEMONS, *CLIENTS) if shutil.which(tool) is None]


@dataclass
class Cluster:
    root: Path
    conf: Path
    nodes: list[str]
    cpus: int  # per node; emulated nodes each claim every core of the machine, which they share
    memory_mb: int
    processes: list[subprocess.Popen] = field(default_factory=list)

    @property
    def env(self) -> dict[str, str]:
        """The environment SLURM's client commands need to find this cluster."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def log_tails(self, lines: int = 30) -> str:
        parts = []
        for log in sorted((self.root / "log").glob("*.log")):
            parts.append(f"--- {log.name}\n" + "\n".join(log.read_text(errors="replace").splitlines()[-lines:]))
        return "\n".join(parts)


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _memory_mb() -> int:
    """Nine tenths of the machine's memory: slurmd drains a node that has less than configured."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(int(line.split()[1]) / 1024 * 0.9)
    raise RuntimeError("no MemTotal in /proc/meminfo")


def _slurm_conf(root: Path, cluster: Cluster, user: str, emulated: EmulatedNodes | None) -> str:
    ctld_port, node_port = _free_ports(2)
    state, log = root / "state", root / "log"
    # slurmctld runs on this host (its name must match) and listens where every node reaches it
    host = socket.gethostname().split(".")[0]
    controller = f"{host}({emulated.host_address})" if emulated else f"{host}(127.0.0.1)"
    addresses = [node.address for node in emulated.nodes] if emulated else ["127.0.0.1"]
    node_lines = "".join(f"NodeName={name} NodeAddr={address} CPUs={cluster.cpus} RealMemory={cluster.memory_mb} "
                         "State=UNKNOWN\n" for name, address in zip(cluster.nodes, addresses))
    return MARKER + f"""\
ClusterName=gpt2dist-test
SlurmctldHost={controller}
SlurmUser={user}
SlurmdUser={user}
SlurmctldPort={ctld_port}
SlurmdPort={node_port}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={root / 'munge.socket'}
StateSaveLocation={state / 'ctld'}
SlurmdSpoolDir={state / 'slurmd-%n'}
SlurmctldPidFile={state / 'slurmctld.pid'}
SlurmdPidFile={state / 'slurmd-%n.pid'}
SlurmctldLogFile={log / 'slurmctld.log'}
SlurmdLogFile={log / 'slurmd-%n.log'}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/affinity
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
MinJobAge=600
KillWait=5
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
{node_lines}PartitionName={PARTITION} Nodes={','.join(cluster.nodes)} Default=YES MaxTime=INFINITE State=UP
"""


def start(root: Path, timeout: float = 60.0, emulated: EmulatedNodes | None = None) -> Cluster:
    """Start munged, slurmctld and a slurmd per node under `root`; return once every node is idle.
    With `emulated` nodes, each slurmd runs inside its node (one munged serves all: its socket is a
    file, which every network namespace sees)."""
    if SYSTEM_CONF.exists() and not SYSTEM_CONF.read_text().startswith(MARKER):
        raise RuntimeError(f"{SYSTEM_CONF} exists and belongs to another cluster; run the cluster test elsewhere")
    names = [node.name for node in emulated.nodes] if emulated else [socket.gethostname().split(".")[0]]
    cluster = Cluster(root, SYSTEM_CONF, names, os.cpu_count() or 1, _memory_mb())
    for sub in ("log", "state/ctld", *(f"state/slurmd-{name}" for name in names)):
        (root / sub).mkdir(parents=True, exist_ok=True)
    user = subprocess.run(["id", "-un"], capture_output=True, text=True, check=True).stdout.strip()
    SYSTEM_CONF.parent.mkdir(parents=True, exist_ok=True)
    SYSTEM_CONF.write_text(_slurm_conf(root, cluster, user, emulated))
    key = root / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    slurmd = [["slurmd", "-D", "-f", str(cluster.conf), "-N", name] for name in names]
    if emulated:
        slurmd = [node.command(command) for node, command in zip(emulated.nodes, slurmd)]
    commands = [
        # --force: munged refuses a socket under /tmp (sticky, world-writable parents) without it
        ["munged", "--foreground", "--force", f"--key-file={key}", f"--socket={root / 'munge.socket'}",
         f"--pid-file={root / 'state' / 'munged.pid'}", f"--log-file={root / 'log' / 'munged.log'}",
         f"--seed-file={root / 'state' / 'munged.seed'}"],
        ["slurmctld", "-D", "-i", "-f", str(cluster.conf)],
        *slurmd,
    ]
    try:
        for i, command in enumerate(commands):
            name = "munged" if i == 0 else "slurmctld" if i == 1 else f"slurmd-{names[i - 2]}"
            cluster.processes.append(subprocess.Popen(command, env=cluster.env, stdout=subprocess.DEVNULL,
                                                      stderr=open(root / "log" / f"{name}.stderr.log", "w")))
            if i == 0:
                _wait_for(lambda: (root / "munge.socket").exists(), timeout, "munged socket", cluster)
        _wait_for(lambda: _node_states(cluster) == ["idle"] * len(names), timeout, "every node idle in sinfo",
                  cluster)
    except BaseException:
        stop(cluster)
        raise
    return cluster


def _node_states(cluster: Cluster) -> list[str]:
    result = subprocess.run(["sinfo", "-h", "-N", "-o", "%T"], env=cluster.env, capture_output=True, text=True,
                            timeout=30)
    return result.stdout.split()


def _wait_for(ready, timeout: float, what: str, cluster: Cluster) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for process in cluster.processes:
            if process.poll() is not None:
                raise RuntimeError(f"{process.args[0]} exited with {process.returncode} while waiting for {what}:\n"
                                   + cluster.log_tails())
        if ready():
            return
        time.sleep(0.5)
    raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}:\n" + cluster.log_tails())


def stop(cluster: Cluster) -> None:
    """Cancel what is still queued, stop the daemons started here (newest first), remove slurm.conf."""
    if any(p.poll() is None for p in cluster.processes[1:]):
        with contextlib.suppress(subprocess.TimeoutExpired):  # the daemons are stopped below all the same
            subprocess.run(["scancel", "--full", f"--partition={PARTITION}"], env=cluster.env, capture_output=True,
                           timeout=30)
    for process in reversed(cluster.processes):
        if process.poll() is None:
            lifetime.stop(process, grace_s=20)
    if SYSTEM_CONF.exists() and SYSTEM_CONF.read_text().startswith(MARKER):
        SYSTEM_CONF.unlink()


def edited_profile(dest: Path, cluster: Cluster) -> Path:
    """workflow/profiles/slurm with what a user edits for their cluster: partition, account, sizes."""
    config = yaml.safe_load((REPO / "workflow/profiles/slurm/config.yaml").read_text())
    defaults = config["default-resources"]
    del defaults["slurm_account"]  # this cluster keeps no accounts
    defaults.update(slurm_partition=PARTITION, cpus_per_task=1, mem_mb=500, runtime=10)
    config["set-resources"]["prepare"].update(slurm_partition=PARTITION, cpus_per_task=cluster.cpus,
                                              mem_mb=1000)
    # cpus_per_task is per rank: the 2-task jobs (selftests as their configuration's runs) must fit on the node
    for rule in ("selftest", "train"):
        config["set-resources"][rule].update(cpus_per_task=max(1, cluster.cpus // 2), mem_mb=1000, runtime=10)
    config.update({
        "slurm-status-command": "squeue",  # and has no accounting database for sacct
        "slurm-init-seconds-before-status-checks": 2,  # tiny jobs: poll soon
        "slurm-keep-successful-logs": True,
    })
    dest.mkdir()
    (dest / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    return dest


# squeue's states of a job that has ended
ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL",
         "DEADLINE"}


def batch_job(env: dict[str, str], args: list[str], timeout: float) -> str:
    """`sbatch ARGS` until the job ends; its final state. Not `sbatch --wait`, which asks at 2, 10 and 42 s (slurm
    22.05 multiplies its wait by four while it is under MinJobAge / 2): a job that ran past 10 s kept it 42 s."""
    submitted = subprocess.run(["sbatch", "--parsable", *args], env=env, capture_output=True, text=True, timeout=60)
    assert submitted.returncode == 0, submitted.stderr
    job = submitted.stdout.strip().split(";")[0]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = subprocess.run(["squeue", "--noheader", "--states=all", f"--jobs={job}", "--format=%T"], env=env,
                               capture_output=True, text=True, timeout=30).stdout.strip()
        if state in ENDED:
            return state
        time.sleep(0.5)
    raise TimeoutError(f"job {job} ({' '.join(args)}) did not end within {timeout:.0f} s")


def jobs(cluster: Cluster) -> list[dict[str, str]]:
    """Every job the cluster still knows (MinJobAge keeps finished ones): id, state, comment, tasks."""
    shown = subprocess.run(["squeue", "--states=all", "--noheader", "--format=%i|%T|%k|%D|%C"],
                           env=cluster.env, capture_output=True, text=True, check=True).stdout
    keys = ("id", "state", "comment", "nodes", "cpus")
    return [dict(zip(keys, line.split("|"))) for line in shown.split()]
