"""Run a multi-node launch on nodes emulated on this machine (launch.emulated_nodes): the same
commands `gpt2dist train --hosts` prints for real machines, started on each emulated node, over
links of a chosen bandwidth. What crossed each node's link is counted and kept in run.json."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

from gpt2dist.config.schema import RunSpec
from gpt2dist.config.strategies import check_tensor_parallel_inside_nodes, describe
from gpt2dist.errors import UsageError
from gpt2dist.launch import commands, lifetime
from gpt2dist.launch import emulated_nodes


@dataclass(frozen=True)
class Emulation:
    nodes: int
    link_mbit: float | None  # each node's link, each way; None: unshaped

    def check(self, spec: RunSpec) -> None:
        """Refuse what emulated nodes cannot run, before anything is made."""
        reason = emulated_nodes.unavailable()
        if reason:
            raise UsageError(f"--emulate-nodes: {reason}")
        if describe(spec.strategy).one_process:
            raise UsageError(f"--emulate-nodes needs a multi-process strategy; {spec.strategy} runs in one process")
        if self.nodes < 2 or spec.nproc % self.nodes:
            raise UsageError(f"--emulate-nodes {self.nodes} must be 2 or more and divide --nproc {spec.nproc}")
        check_tensor_parallel_inside_nodes(spec, self.nodes)


def run(spec: RunSpec, emulation: Emulation) -> tuple[int, int | None, dict, str | None]:
    """Start the run's ranks on `emulation.nodes` emulated nodes; return the launchers' exit code, the
    stop signal forwarded to them (if any), what run.json records of the nodes, and a failure's line."""
    launcher = describe(spec.strategy).launcher
    out = Path(spec.out_dir)
    with contextlib.ExitStack() as stack:
        made = stack.enter_context(emulated_nodes.emulated_nodes(emulation.nodes, emulation.link_mbit))
        if launcher == "horovodrun":
            stack.enter_context(emulated_nodes.ssh_between(made))
        hosts = [commands.Host(node.name, spec.nproc // emulation.nodes) for node in made.nodes]
        printed = commands.multinode_commands(launcher, hosts, out / "spec.json", run_id=out.name)
        if launcher == "torchrun":
            used = {"every node": printed["every node"]}
            started = [node.command(commands.runnable(used["every node"])) for node in made.nodes]
        else:
            where = f"{made.nodes[0].name} (horovodrun)"
            used = {where: printed[where]}
            started = [made.nodes[0].command(commands.runnable(used[where]))]
        # the nodes share this machine's cores: the thread budget is split over every rank, not per node
        code, stopped_by, error = lifetime.run_launchers(started, commands.launch_env(spec.nproc))
        record = {"nodes": emulation.nodes, "ranks_per_node": hosts[0].slots, "link_mbit": emulation.link_mbit,
                  "latency": "not emulated", "commands": used,
                  "link_bytes": {node.name: node.interface_bytes() for node in made.nodes}}
    return code, stopped_by, record, error
