"""The cluster a study is planned for, GPUs per node and nodes: what the user said (params.yaml's gpus_per_node
and nodes, or the command line) over what the planning host happens to see, since plans are often made on a
login node."""

from __future__ import annotations

from pathlib import Path

from gpt2dist.config.presets import read_params
from gpt2dist.errors import UsageError


def planned_gpus(path: Path, visible: int) -> int:
    """GPUs per node to plan a study for: params.yaml's gpus_per_node, else those visible here."""
    gpus = read_params(path).get("gpus_per_node")
    if gpus is None:
        return visible
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 0:
        raise UsageError(f"gpus_per_node in {path} must be a whole number of GPUs per node, 0 or more (not {gpus!r})")
    return gpus


def gpus_given(path: Path, given: int | None) -> bool:
    """Whether the user said how many GPUs a node has (--gpus, or params.yaml's gpus_per_node), rather than
    leaving it to what the planning host sees."""
    return given is not None or read_params(path).get("gpus_per_node") is not None


def planned_nodes(path: Path, given: int | None = None) -> int:
    """Nodes of the cluster a study may span: as given (--nodes, or Snakemake's --config nodes=N), else
    params.yaml's nodes, else 1."""
    nodes = read_params(path).get("nodes", 1) if given is None else given
    if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 1:
        where = "--nodes" if given is not None else f"nodes in {path}"
        raise UsageError(f"{where} must be a whole number of nodes, 1 or more (not {nodes!r})")
    return nodes


def check_plan_fits(path: Path, planned: int, visible: int) -> None:
    """Refuse a CPU plan (--gpus 0, as the committed dvc.yaml has) on a machine with GPUs: it would
    train the CPU study on CUDA, or fail at its first 2-process run. A CPU study on a GPU machine
    stays possible by saying so in params.yaml."""
    if planned == 0 and visible > 0 and read_params(path).get("gpus_per_node") is None:
        raise UsageError(
            f"this study was planned for CPU (--gpus 0, as in the committed dvc.yaml) but this machine has {visible} "
            f"CUDA GPUs; regenerate the plan with `gpt2dist dvc-yaml` (or set gpus_per_node: 0 in {path} to run "
            f"the CPU study here)"
        )


def hosts_gpus(path: Path, given: int | None, visible: int, slots: dict[str, int]) -> int:
    """GPUs per host of the machines `train --hosts` writes commands for: as given (--gpus), else
    params.yaml's gpus_per_node, else this host's when it has some. A host without GPUs cannot speak
    for the others, so it refuses rather than write a CPU spec for what may be GPU nodes."""
    if given is None:
        given = planned_gpus(path, visible)
        if given == 0 and read_params(path).get("gpus_per_node") is None:
            raise UsageError("--hosts writes commands for other machines and this one has no GPUs to go by: give "
                             f"their GPUs per host with --gpus N (--gpus 0 for CPU hosts), or gpus_per_node in {path}")
    if given < 0:
        raise UsageError(f"--gpus must be 0 or more GPUs per host, not {given}")
    crowded = [name for name, count in slots.items() if given and count > given]
    if crowded:
        raise UsageError(f"--hosts gives {crowded[0]} {slots[crowded[0]]} processes but each host has {given} GPUs; "
                         f"give each host at most {given} slots (one process per GPU)")
    return given
