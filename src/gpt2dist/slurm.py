"""Launch commands inside a SLURM job: the job's allocation, and how ranks start in it.

Several nodes: ddp/fsdp start one torchrun per node with `srun`, which meet at a c10d
rendezvous on the first node; horovod starts every rank with `srun --mpi=pmix` (Horovod's
MPI controller) or horovodrun with -H built from the node list. One node with a task per
rank (the pipeline's train jobs on a cluster): ddp/fsdp ranks are the job's SLURM tasks,
started by one `srun`. With an image, every task runs in it: `srun ... apptainer exec --nv`.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import hostlist

from gpt2dist.errors import UsageError
from gpt2dist.launch import DEFAULT_PORT


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


def launch_command(launcher: str, nproc: int, allocation: Allocation, spec_path: Path, *, image: str | None = None,
                   run_id: str = "gpt2dist") -> list[str] | None:
    """How this allocation starts `nproc` ranks; None when the one-machine launcher applies."""
    if len(allocation.nodes) > 1:
        world = len(allocation.nodes) * allocation.ranks_per_node
        if world != nproc:
            raise UsageError(f"--nproc {nproc} does not match the SLURM allocation of {len(allocation.nodes)} nodes "
                             f"x {allocation.ranks_per_node} ranks ({world})")
        return srun_command(launcher, allocation, spec_path, image=image, run_id=run_id)
    if launcher == "torchrun" and nproc > 1 and allocation.tasks == nproc:
        return srun_tasks_command(allocation, spec_path, image=image)
    return None


def _inside(image: str | None) -> list[str]:
    return ["apptainer", "exec", "--nv", image] if image else []


def _python(image: str | None) -> list[str]:
    """The image's python inside it; this interpreter (its environment) on the host."""
    return [*_inside(image), "python"] if image else [sys.executable]


def srun_tasks_command(allocation: Allocation, spec_path: Path, *, image: str | None = None) -> list[str]:
    """Every SLURM task is one rank; the ranks read rank and rendezvous from SLURM's variables."""
    return ["srun", f"--ntasks={allocation.tasks}", f"--cpus-per-task={allocation.cpus_per_task}",
            "--kill-on-bad-exit=1", *_python(image), "-m", "gpt2dist.worker", str(spec_path)]


def srun_command(launcher: str, allocation: Allocation, spec_path: Path, *, image: str | None = None,
                 run_id: str = "gpt2dist", port: int = DEFAULT_PORT, use_horovodrun: bool = False) -> list[str]:
    n, g = len(allocation.nodes), allocation.ranks_per_node
    inside = _inside(image)
    worker = ["-m", "gpt2dist.worker", str(spec_path)]
    if launcher == "torchrun":
        # one task per node holds that node's ranks, so it gets all their cores
        return ["srun", f"--nodes={n}", "--ntasks-per-node=1", f"--cpus-per-task={allocation.cpus_per_task * g}",
                "--kill-on-bad-exit=1", *inside, "torchrun", f"--nnodes={n}", f"--nproc-per-node={g}",
                "--rdzv-backend=c10d", f"--rdzv-endpoint={allocation.nodes[0]}:{port}", f"--rdzv-id={run_id}",
                *worker]
    if launcher == "horovodrun" and use_horovodrun:
        hosts = ",".join(f"{node}:{g}" for node in allocation.nodes)
        return [*inside, "horovodrun", "-np", str(n * g), "-H", hosts, "python", *worker]
    if launcher == "horovodrun":
        return ["srun", "--mpi=pmix", f"--nodes={n}", f"--ntasks-per-node={g}",
                f"--cpus-per-task={allocation.cpus_per_task}", "--kill-on-bad-exit=1", *_python(image), *worker]
    raise UsageError(f"a {launcher} strategy runs in one process; several nodes need ddp, fsdp or horovod")
