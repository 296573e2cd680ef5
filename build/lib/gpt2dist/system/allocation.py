"""The SLURM job this process runs in: its nodes, tasks, CPUs and GPUs, as `gpt2dist train`
reads them to start its ranks and `gpt2dist doctor` shows them. Read from SLURM's
variables, or from `scontrol` when a job step hides them."""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass

import hostlist

from gpt2dist.config.schema import DEFAULT_PORT
from gpt2dist.errors import UsageError


@dataclass(frozen=True)
class Allocation:
    nodes: list[str]
    tasks: int
    cpus_per_task: int = 1
    gpus_per_node: int = 0

    @property
    def ranks_per_node(self) -> int:
        """One rank per GPU; on CPU nodes, one per task."""
        return self.gpus_per_node or max(1, self.tasks // len(self.nodes))


def rendezvous_port(env: dict[str, str] | None = None) -> int:
    """The port a SLURM job's ranks meet at: DEFAULT_PORT offset by the job id, so two jobs that share a node (two
    multi-node selftests, say) never try the same one; DEFAULT_PORT outside a job."""
    job_id = (os.environ if env is None else env).get("SLURM_JOB_ID", "")
    return DEFAULT_PORT + (int(job_id) % 1000 if job_id.isdigit() else 0)


def _count(value: str | None) -> int:
    """SLURM's per-node counts read '8' or '8(x2)'."""
    return int(value.split("(")[0]) if value else 0


def job_allocation(env: dict[str, str] | None = None) -> Allocation | None:
    """The allocation of the job whose batch script this is; None outside a job, and inside
    a job step (`srun gpt2dist train ...`), where this process is one task already."""
    env = os.environ if env is None else env
    job_id = env.get("SLURM_JOB_ID")
    if not job_id or "SLURM_STEP_ID" in env:
        return None
    if "SLURM_JOB_NODELIST" in env and "SLURM_NTASKS" in env:
        return Allocation(hostlist.expand_hostlist(env["SLURM_JOB_NODELIST"]), int(env["SLURM_NTASKS"]),
                          _count(env.get("SLURM_CPUS_PER_TASK")) or 1, _count(env.get("SLURM_GPUS_ON_NODE")))
    # Snakemake's SLURM job step passes on SLURM_JOB_ID alone: ask the controller for the rest
    shown = subprocess.run(["scontrol", "show", "job", "--oneliner", job_id], capture_output=True, text=True)
    if shown.returncode:
        raise UsageError(f"scontrol cannot show SLURM job {job_id}: {shown.stderr.strip()}")
    return parse_show_job(shown.stdout)


def parse_show_job(line: str) -> Allocation:
    """An Allocation from one line of `scontrol show job --oneliner`."""
    fields = dict(re.findall(r"(?:^|\s)([\w/:]+)=(\S*)", line))
    nodes = hostlist.expand_hostlist(fields.get("NodeList", ""))
    if not nodes or "NumTasks" not in fields:
        raise UsageError(f"scontrol shows no running allocation: {line.strip()[:200]}")
    gpus = re.search(r"gres/gpu(?::[\w.-]+)?=(\d+)", fields.get("TRES", ""))
    cpus = fields.get("CPUs/Task", "1")
    return Allocation(nodes, int(fields["NumTasks"]), int(cpus) if cpus.isdigit() else 1,
                      int(gpus[1]) // len(nodes) if gpus else 0)
