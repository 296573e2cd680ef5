"""Launch commands inside a SLURM job: how ranks start in its allocation.

Several nodes: ddp/fsdp start one torchrun per node with `srun`, which meet at a c10d
rendezvous on the first node; horovod starts every rank with `srun --mpi=pmix` (Horovod's
MPI controller) or horovodrun with -H built from the node list. One node with a task per
rank (the pipeline's train jobs on a cluster): ddp/fsdp ranks are the job's SLURM tasks,
started by one `srun`. With an image (GPT2DIST_IMAGE), every task runs in it, through the runtime
GPT2DIST_CONTAINER_RUNTIME names: `srun ... apptainer exec --nv IMAGE` (the default), or NVIDIA's pyxis
plugin, whose options ask srun itself to start each task in the image (`srun --container-image=IMAGE`).
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from gpt2dist.errors import UsageError
from gpt2dist.launch import commands
from gpt2dist.system.allocation import Allocation, rendezvous_port


@dataclass(frozen=True)
class HorovodLaunch:
    """How Horovod's ranks start over several nodes, and why: never guessed without a record."""

    via: str  # "srun --mpi=pmix" or "horovodrun over ssh"
    why: str
    gloo: bool  # horovodrun's controller: Gloo where Horovod has no MPI

    @property
    def use_horovodrun(self) -> bool:
        return self.via != PMIX


PMIX = "srun --mpi=pmix"
RUNTIMES = ("apptainer", "pyxis")


@dataclass(frozen=True)
class Container:
    """The image every task runs in, and how: apptainer wraps the task's command; pyxis gives srun options,
    with the working directory mounted at the same path so the run's files are where the host sees them."""

    image: str
    runtime: str = "apptainer"
    workdir: str = "."

    def srun_options(self) -> list[str]:
        if self.runtime != "pyxis":
            return []
        workdir = str(Path(self.workdir).resolve())
        return [f"--container-image={self.image}", f"--container-mounts={workdir}:{workdir}",
                f"--container-workdir={workdir}"]

    def wrapper(self) -> list[str]:
        return ["apptainer", "exec", "--nv", self.image] if self.runtime == "apptainer" else []


def container_from_env(env: dict[str, str] | None = None) -> Container | None:
    """GPT2DIST_IMAGE's image with GPT2DIST_CONTAINER_RUNTIME's runtime (default apptainer); None: on the host."""
    env = os.environ if env is None else env
    runtime = env.get("GPT2DIST_CONTAINER_RUNTIME") or "apptainer"
    if runtime not in RUNTIMES:
        raise UsageError(f"GPT2DIST_CONTAINER_RUNTIME is '{runtime}'; use one of {', '.join(RUNTIMES)}")
    image = env.get("GPT2DIST_IMAGE")
    return Container(image, runtime, os.getcwd()) if image else None


def horovod_launch(srun_mpi_types: str, mpi_built: bool) -> HorovodLaunch:
    """srun --mpi=pmix where this SLURM has the PMIx plugin and Horovod was built with MPI (one task per rank,
    SLURM wires them up); otherwise horovodrun from the first node over ssh, with Gloo where Horovod has no MPI.
    `srun_mpi_types` is what `srun --mpi=list` printed."""
    pmix = "pmix" in srun_mpi_types.lower()
    if pmix and mpi_built:
        return HorovodLaunch(PMIX, "SLURM lists the pmix plugin and Horovod was built with MPI", gloo=False)
    reason = "Horovod was built without MPI" if pmix else "srun --mpi=list shows no pmix plugin"
    return HorovodLaunch("horovodrun over ssh", f"{reason}: horovodrun starts the other nodes' ranks over ssh",
                         gloo=not mpi_built)


def detect_horovod_launch() -> HorovodLaunch:
    """horovod_launch for this machine's SLURM and Horovod (inside the job, where srun knows its cluster)."""
    from gpt2dist.system.environment import horovod_build

    listed = subprocess.run(["srun", "--mpi=list"], capture_output=True, text=True)
    build = horovod_build() or {}
    return horovod_launch(listed.stdout + listed.stderr, bool(build.get("mpi")))


def launch_command(launcher: str, nproc: int, allocation: Allocation, spec_path: Path, *,
                   container: Container | None = None,
                   run_id: str = "gpt2dist", horovod: HorovodLaunch | None = None) -> list[str] | None:
    """How this allocation starts `nproc` ranks; None when the one-machine launcher applies. Over several nodes
    Horovod starts as `horovod` says (detect_horovod_launch() when not given)."""
    if len(allocation.nodes) > 1:
        world = len(allocation.nodes) * allocation.ranks_per_node
        if world != nproc:
            raise UsageError(f"--nproc {nproc} does not match the SLURM allocation of {len(allocation.nodes)} nodes "
                             f"x {allocation.ranks_per_node} ranks ({world})")
        if launcher == "horovodrun" and horovod is None:
            horovod = detect_horovod_launch()
        return srun_command(launcher, allocation, spec_path, container=container, run_id=run_id, horovod=horovod)
    if launcher == "torchrun" and nproc > 1 and allocation.tasks == nproc:
        return srun_tasks_command(allocation, spec_path, container=container)
    return None


def _srun(container: Container | None) -> list[str]:
    return ["srun", *(container.srun_options() if container else [])]


def _python(container: Container | None) -> list[str]:
    """The image's python inside it; this interpreter (its environment) on the host."""
    return [*container.wrapper(), "python"] if container else [sys.executable]


def srun_tasks_command(allocation: Allocation, spec_path: Path, *, container: Container | None = None) -> list[str]:
    """Every SLURM task is one rank; the ranks read rank and rendezvous from SLURM's variables."""
    return [*_srun(container), f"--ntasks={allocation.tasks}", f"--cpus-per-task={allocation.cpus_per_task}",
            "--kill-on-bad-exit=1", *_python(container), "-m", "gpt2dist.launch.worker", str(spec_path)]


def srun_command(launcher: str, allocation: Allocation, spec_path: Path, *, container: Container | None = None,
                 run_id: str = "gpt2dist", port: int | None = None, horovod: HorovodLaunch | None = None) -> list[str]:
    """The command that starts the ranks over the allocation's nodes; torchrun's rendezvous on the first node at
    `port` (default: this job's, allocation.rendezvous_port)."""
    n, g = len(allocation.nodes), allocation.ranks_per_node
    port = rendezvous_port() if port is None else port
    worker = ["-m", "gpt2dist.launch.worker", str(spec_path)]
    if launcher == "torchrun":
        # one task per node holds that node's ranks, so it gets all their cores; on the host, this
        # environment's torchrun (a job's PATH need not hold it)
        torchrun = [*container.wrapper(), "torchrun"] if container else [sys.executable, "-m", "torch.distributed.run"]
        return [*_srun(container), f"--nodes={n}", "--ntasks-per-node=1", f"--cpus-per-task={allocation.cpus_per_task * g}",
                "--kill-on-bad-exit=1", *torchrun, f"--nnodes={n}", f"--nproc-per-node={g}",
                "--rdzv-backend=c10d", f"--rdzv-endpoint={allocation.nodes[0]}:{port}", f"--rdzv-id={run_id}",
                commands.torchrun_log_option(spec_path), *worker]
    if launcher == "horovodrun" and horovod is not None and horovod.use_horovodrun:
        if container and container.runtime == "pyxis":
            raise UsageError(f"Horovod across nodes starts here with horovodrun over ssh ({horovod.why}), which pyxis "
                             "cannot start inside the image: use GPT2DIST_CONTAINER_RUNTIME=apptainer, or build Horovod "
                             "with MPI on a SLURM with the pmix plugin")
        hosts = ",".join(f"{node}:{g}" for node in allocation.nodes)
        horovodrun = [*container.wrapper(), "horovodrun"] if container else [commands.horovodrun_bin()]
        # with an image, horovodrun runs inside it on the first node, and so do the ranks it starts there
        python = ["python"] if container else [sys.executable]
        return [*horovodrun, "-np", str(n * g), "-H", hosts, *(["--gloo"] if horovod.gloo else []), *python, *worker]
    if launcher == "horovodrun":
        return [*_srun(container), "--mpi=pmix", f"--nodes={n}", f"--ntasks-per-node={g}",
                f"--cpus-per-task={allocation.cpus_per_task}", "--kill-on-bad-exit=1", *_python(container), *worker]
    raise UsageError(f"a {launcher} strategy runs in one process; several nodes need one of "
                     f"{', '.join(commands.multi_process())}")
