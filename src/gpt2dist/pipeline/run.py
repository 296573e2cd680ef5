"""A study's run: its configuration and repeat, and the id that names both (ddp-bf16-n2-r0) in directories,
rules and stages."""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpt2dist.config.configuration import Configuration
from gpt2dist.config.placement import Placement
from gpt2dist.config.schema import PRECISIONS, SIZE_NAME
from gpt2dist.config.split import NAME_PATTERN, parse_split
from gpt2dist.errors import UsageError

# the strategy is any name (ddp, fsdp-tp, ddp-tp2-pp2); parse_run_id checks it
RUN_ID = re.compile(rf"^(?P<strategy>{NAME_PATTERN})-(?P<precision>{'|'.join(map(re.escape, PRECISIONS))})"
                    rf"-n(?P<nproc>\d+)(?:-(?P<size>{SIZE_NAME[1:-1]}))?(?:-(?P<nodes>\d+)nodes(?:-(?P<link>\d+(?:\.\d+)?)mbit)?)?"
                    r"-r(?P<repeat>\d+)$")


@dataclass(frozen=True)
class Run:
    strategy: str
    precision: str
    nproc: int
    repeat: int
    nodes: int = 1  # above 1: a cluster's nodes (a SLURM allocation), or emulated ones
    link_mbit: float | None = None  # each emulated node's link; None: unshaped
    emulated: bool = False  # nodes emulated on this machine (launch/emulated.py)
    size: str | None = None  # a model size of the study's (config.sizes); None: the preset's model

    @property
    def configuration(self) -> Configuration:
        return Configuration(self.strategy, self.precision,
                             Placement(self.nproc, self.nodes, self.emulated, self.link_mbit, self.size))

    @property
    def config_id(self) -> str:
        return self.configuration.id

    @property
    def run_id(self) -> str:
        return f"{self.config_id}-r{self.repeat}"

    def node_args(self) -> list[str]:
        """`gpt2dist train` options that spread this run over its nodes (none for one node)."""
        if self.nodes == 1:
            return []
        if not self.emulated:
            return ["--nodes", str(self.nodes)]
        return ["--emulate-nodes", str(self.nodes), *(["--link-mbit", f"{self.link_mbit:g}"] if self.link_mbit else [])]

    def size_args(self) -> list[str]:
        """`gpt2dist train` options that train this run's model size (none for the preset's model)."""
        return ["--size", self.size] if self.size else []


def parse_run_id(text: str) -> Run:
    match = RUN_ID.match(text)
    if not match:
        raise UsageError(f"'{text}' is not a run id like ddp-bf16-n2-r0")
    parse_split(match["strategy"], said=f"run id {text}: strategy")
    return Run(match["strategy"], match["precision"], int(match["nproc"]), int(match["repeat"]), int(match["nodes"] or 1),
               float(match["link"]) if match["link"] else None, size=match["size"])
