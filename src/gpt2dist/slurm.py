"""Launch commands for one SLURM allocation of N nodes x G GPUs.

ddp/fsdp: `srun` starts one torchrun per node, which meet at a c10d rendezvous on the
first node and start G ranks each. horovod: `srun --mpi=pmix` starts every rank itself
(Horovod's MPI controller), or horovodrun with -H built from the node list. With an
image, every task runs inside it: `srun ... apptainer exec --nv IMAGE ...`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import hostlist

from gpt2dist.errors import UsageError
from gpt2dist.launch import DEFAULT_PORT


@dataclass(frozen=True)
class Allocation:
    nodes: list[str]
    gpus_per_node: int


def allocation_from_env(env: dict[str, str] | None = None) -> Allocation | None:
    """The job's allocation from SLURM's variables; None outside a multi-node job."""
    env = os.environ if env is None else env
    if int(env.get("SLURM_NNODES", "1")) < 2 or "SLURM_JOB_NODELIST" not in env:
        return None
    nodes = hostlist.expand_hostlist(env["SLURM_JOB_NODELIST"])
    per_node = env.get("SLURM_GPUS_ON_NODE") or env.get("SLURM_NTASKS_PER_NODE", "1")
    return Allocation(nodes, int(per_node.split("(")[0]))


def srun_command(launcher: str, allocation: Allocation, spec_path: Path, *, image: str | None = None,
                 run_id: str = "gpt2dist", port: int = DEFAULT_PORT, use_horovodrun: bool = False) -> list[str]:
    n, g = len(allocation.nodes), allocation.gpus_per_node
    inside = ["apptainer", "exec", "--nv", image] if image else []
    worker = ["-m", "gpt2dist.worker", str(spec_path)]
    if launcher == "torchrun":
        return ["srun", f"--nodes={n}", "--ntasks-per-node=1", *inside, "torchrun", f"--nnodes={n}",
                f"--nproc-per-node={g}", "--rdzv-backend=c10d", f"--rdzv-endpoint={allocation.nodes[0]}:{port}",
                f"--rdzv-id={run_id}", *worker]
    if launcher == "horovodrun" and use_horovodrun:
        hosts = ",".join(f"{node}:{g}" for node in allocation.nodes)
        return [*inside, "horovodrun", "-np", str(n * g), "-H", hosts, "python", *worker]
    if launcher == "horovodrun":
        return ["srun", "--mpi=pmix", f"--nodes={n}", f"--ntasks-per-node={g}", *inside, "python", *worker]
    raise UsageError(f"a {launcher} strategy runs in one process; several nodes need ddp, fsdp or horovod")
