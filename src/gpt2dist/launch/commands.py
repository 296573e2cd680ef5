"""Launcher command lines: plain python, torchrun, horovodrun and mpirun, one node or many.

Every rank runs gpt2dist.launch.worker with the resolved RunSpec (`python -m gpt2dist.launch.worker SPEC`, or
its file in a rank that torchrun forks on CPUs), so launchers differ only in how they start processes and tell
them their rank.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from gpt2dist.config.schema import DEFAULT_PORT
from gpt2dist.config.strategies import STRATEGIES
from gpt2dist.errors import UsageError

WORKER_FILE = Path(__file__).with_name("worker.py")  # a forked rank runs it as a file: its name, without importing it
# torchrun's agent makes a log directory for each launch, in the temporary directory unless told where, and never
# removes it (one torchelastic_* a launch, empty: the ranks write their own logs); told this one in the run directory,
# which the runner removes when the launch ends (runner.start)
TORCHRUN_LOGS = "torchrun-logs"
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS",
                    "NUMEXPR_NUM_THREADS", "VECLIB_MAXIMUM_THREADS")


@dataclass(frozen=True)
class Host:
    name: str
    slots: int


def parse_hosts(text: str) -> list[Host]:
    """'node1:8,node2:8' -> hosts with their process slots (horovodrun's -H syntax)."""
    hosts = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, slots = item.partition(":")
        if not name or not sep or not slots.isdigit() or int(slots) < 1:
            raise UsageError(f"--hosts entry '{item}' is not HOST:SLOTS (e.g. node1:8,node2:8)")
        hosts.append(Host(name, int(slots)))
    if not hosts:
        raise UsageError("--hosts is empty; give HOST:SLOTS entries, e.g. node1:8,node2:8")
    return hosts


def multi_process() -> list[str]:
    """The strategies whose ranks are processes of their own, which can spread over machines."""
    return [name for name, d in STRATEGIES.items() if not d.one_process]


def worker_args(spec_path: Path, python: str = sys.executable) -> list[str]:
    return [python, "-m", "gpt2dist.launch.worker", str(spec_path)]


def torchrun_log_option(spec_path: Path) -> str:
    """torchrun's --log-dir for the run whose spec is `spec_path`: beside it, in the run directory."""
    return f"--log-dir={spec_path.parent / TORCHRUN_LOGS}"


def horovodrun_bin() -> str:
    beside = Path(sys.executable).with_name("horovodrun")
    found = str(beside) if beside.exists() else shutil.which("horovodrun")
    if not found:
        raise UsageError("horovodrun is not on PATH; install Horovod with containers/install_horovod.sh")
    return found


def local_command(launcher: str, nproc: int, spec_path: Path, device: str) -> list[str] | None:
    """The command for one machine; None means train inside this process. On CPUs torchrun forks its ranks
    from a process that imported them (forking_torchrun); on GPUs each rank is a fresh interpreter."""
    if launcher == "python":
        return None
    if launcher == "torchrun":
        if device == "cpu":
            return [sys.executable, "-m", "gpt2dist.launch.forking_torchrun", "--standalone",
                    f"--nproc-per-node={nproc}", "--start-method=fork", torchrun_log_option(spec_path), "--run-path",
                    str(WORKER_FILE), str(spec_path)]
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
                torchrun_log_option(spec_path), "-m", "gpt2dist.launch.worker", str(spec_path)]
    if launcher == "horovodrun":
        # Gloo as the controller on GPUs too (NCCL still carries the GPU tensors): horovodrun 0.28.1's mpirun
        # line (`-bind-to none`) is refused by Open MPI 5, which reads "none" as the program (seen on an H200)
        return [horovodrun_bin(), "-np", str(nproc), "-H", f"localhost:{nproc}", "--gloo", *worker_args(spec_path)]
    raise ValueError(f"unknown launcher {launcher}")


def multinode_commands(launcher: str, hosts: list[Host], spec_path: Path, *, port: int = DEFAULT_PORT,
                       run_id: str = "gpt2dist") -> dict[str, str]:
    """Commands for several machines, keyed by where they run.

    torchrun runs the same command on every node and meets at a c10d rendezvous on the
    first; horovodrun (with its Gloo controller: see local_command) and mpirun start every rank from the
    first node over SSH.
    """
    world = sum(h.slots for h in hosts)
    spec = shlex.quote(str(spec_path))
    if launcher == "torchrun":
        if len({h.slots for h in hosts}) != 1:
            raise UsageError("torchrun needs the same number of processes on every host (--hosts slots differ)")
        cmd = (f"torchrun --nnodes={len(hosts)} --nproc-per-node={hosts[0].slots} --rdzv-backend=c10d "
               f"--rdzv-endpoint={hosts[0].name}:{port} --rdzv-id={run_id} "
               f"{shlex.quote(torchrun_log_option(spec_path))} -m gpt2dist.launch.worker {spec}")
        return {"every node": cmd}
    if launcher == "horovodrun":
        host_list = ",".join(f"{h.name}:{h.slots}" for h in hosts)
        return {
            hosts[0].name + " (horovodrun)": (f"horovodrun -np {world} -H {host_list} --gloo "
                                              f"python -m gpt2dist.launch.worker {spec}"),
            hosts[0].name + " (mpirun)": (
                # double-dash options: Open MPI 5 no longer takes -bind-to or -mca
                f"mpirun -np {world} -H {host_list} --bind-to none --map-by slot "
                "-x NCCL_DEBUG=INFO -x LD_LIBRARY_PATH -x PATH --mca pml ob1 "
                f"python -m gpt2dist.launch.worker {spec}"
            ),
        }
    raise UsageError(f"strategy runs in one process ({launcher}); --hosts needs one of {', '.join(multi_process())}")


def runnable(command: str) -> list[str]:
    """A printed command as this machine runs it: `python`, `torchrun` and `horovodrun` are this
    environment's, whatever PATH holds."""
    argv = shlex.split(command)
    programs = {"python": [sys.executable], "torchrun": [sys.executable, "-m", "torch.distributed.run"]}
    if argv[0] == "horovodrun":
        programs["horovodrun"] = [horovodrun_bin()]
    return [part for word in argv for part in programs.get(word, [word])]


def launch_env(nproc: int, environ: dict[str, str] | None = None, cores: int | None = None) -> dict[str, str]:
    """Split the job's threads between its ranks.

    An inherited OMP_NUM_THREADS is the whole job's budget (Snakemake exports a job's
    `threads` this way), not each rank's: passed on unchanged, N ranks would each start
    that many threads and oversubscribe the cores. The budget never exceeds the cores this
    process may run on (in a SLURM job, its allocation, not the whole node).
    """
    env = dict(os.environ if environ is None else environ)
    if cores is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    budget = min(int(env.get("OMP_NUM_THREADS") or cores), cores)
    per_rank = str(max(1, budget // nproc))
    # MKL reads its own variable before OMP's: left at the job's budget, 2 ranks on 2 cores
    # ran Horovod 8x slower (1.6k against 12.9k tokens/s).
    env.update(dict.fromkeys(THREAD_VARIABLES, per_rank))
    return env
