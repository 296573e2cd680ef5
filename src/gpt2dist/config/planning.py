"""The cluster a study is planned for, GPUs per node and nodes: what the user said (params.yaml's gpus_per_node
and nodes, or the command line) over what the planning host happens to see, since plans are often made on a
login node."""

from __future__ import annotations

from gpt2dist.config.presets import Params
from gpt2dist.errors import UsageError


def planned_gpus(params: Params, visible: int) -> int:
    """GPUs per node to plan a study for: params.yaml's gpus_per_node, else those visible here."""
    gpus = params.gpus_per_node
    return visible if gpus is None else gpus


def gpus_given(params: Params, given: int | None) -> bool:
    """Whether the user said how many GPUs a node has (--gpus, or params.yaml's gpus_per_node), rather than
    leaving it to what the planning host sees."""
    return given is not None or params.gpus_per_node is not None


def planned_nodes(params: Params, given: int | None = None) -> int:
    """Nodes of the cluster a study may span: as given (--nodes, or Snakemake's --config nodes=N), else
    params.yaml's nodes, else 1."""
    if given is None:
        return params.nodes
    if isinstance(given, bool) or not isinstance(given, int) or given < 1:
        raise UsageError(f"--nodes must be a whole number of nodes, 1 or more (not {given!r})")
    return given


def check_plan_fits(params: Params, planned: int, visible: int) -> None:
    """Refuse a CPU plan (--gpus 0, as the committed dvc.yaml has) on a machine with GPUs: it would
    train the CPU study on CUDA, or fail at its first 2-process run. A CPU study on a GPU machine
    stays possible by saying so in params.yaml."""
    if planned == 0 and visible > 0 and params.gpus_per_node is None:
        raise UsageError(
            f"this study was planned for CPU (--gpus 0, as in the committed dvc.yaml) but this machine has {visible} "
            f"CUDA GPUs; regenerate the plan with `gpt2dist dvc-yaml` (or set gpus_per_node: 0 in {params.path} to "
            "run the CPU study here)"
        )


def hosts_gpus(params: Params, given: int | None, visible: int, slots: dict[str, int]) -> int:
    """GPUs per host of the machines `train --hosts` writes commands for: as given (--gpus), else
    params.yaml's gpus_per_node, else this host's when it has some. A host without GPUs cannot speak
    for the others, so it refuses rather than write a CPU spec for what may be GPU nodes."""
    if given is None:
        given = planned_gpus(params, visible)
        if given == 0 and params.gpus_per_node is None:
            raise UsageError("--hosts writes commands for other machines and this one has no GPUs to go by: give "
                             f"their GPUs per host with --gpus N (--gpus 0 for CPU hosts), or gpus_per_node in "
                             f"{params.path}")
    if given < 0:
        raise UsageError(f"--gpus must be 0 or more GPUs per host, not {given}")
    crowded = [name for name, count in slots.items() if given and count > given]
    if crowded:
        raise UsageError(f"--hosts gives {crowded[0]} {slots[crowded[0]]} processes but each host has {given} GPUs; "
                         f"give each host at most {given} slots (one process per GPU)")
    return given
