"""Where a configuration runs, decided and worded in one place: its processes, its nodes (none beyond one machine,
emulated ones on this machine, or a cluster's), their link, and its model size in a study of sizes. The summary,
the answer, the figures, the findings and the step model read a row's placement from here instead of each
testing `nodes` and `emulated` its own way."""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum

from gpt2dist.config.sizes import size_words


class Kind(str, Enum):
    ONE_MACHINE = "one machine"
    EMULATED = "emulated nodes"  # network namespaces on this machine, sharing its cores (launch/emulated_nodes.py)
    CLUSTER = "cluster"  # a cluster's nodes, each its own machine


def _missing(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


@dataclass(frozen=True)
class Placement:
    nproc: int
    nodes: int = 1
    emulated: bool = False
    link_mbit: float | None = None  # each emulated node's shaped link; None: unshaped
    size: str | None = None  # a model size of the study's; None: the preset's model
    busbw_gb_s: float | None = None  # a cluster's measured bus bandwidth, where the run measured it

    @classmethod
    def of(cls, row: dict) -> Placement:
        """A summary's or a plan's row. Summaries from before a cluster's nodes could be planned have no
        `emulated`: every run of theirs on several nodes was emulated."""
        nodes = 1 if _missing(row.get("nodes")) else int(row["nodes"])
        emulated = row.get("emulated")
        size, link, busbw = row.get("size"), row.get("link_mbit"), row.get("busbw_gb_s")
        return cls(int(row["nproc"]), nodes, bool(nodes > 1 if _missing(emulated) else emulated),
                   None if _missing(link) else float(link), size if isinstance(size, str) else None,
                   None if _missing(busbw) else float(busbw))

    @property
    def kind(self) -> Kind:
        if self.nodes == 1:
            return Kind.ONE_MACHINE
        return Kind.EMULATED if self.emulated else Kind.CLUSTER

    def words(self) -> str:
        """For the answer: 'GPT-2 medium, 4 processes on one machine', '8 processes on 2 emulated nodes, 100 Mbit/s'."""
        processes = self._processes()
        spread = {Kind.ONE_MACHINE: f"{processes} on one machine", Kind.CLUSTER: f"{processes} on {self.nodes} nodes",
                  Kind.EMULATED: f"{processes} on {self.nodes} emulated nodes, {self._link('unshaped links')}"}
        return self._model() + spread[self.kind]

    def short_words(self) -> str:
        """For a figure's panel: '4 processes', '8 processes on 2 nodes, 100 Mbit/s'."""
        processes = self._processes()
        spread = {Kind.ONE_MACHINE: processes, Kind.CLUSTER: f"{processes} on {self.nodes} nodes",
                  Kind.EMULATED: f"{processes} on {self.nodes} nodes, {self._link('unshaped link')}"}
        return self._model() + spread[self.kind]

    def where(self) -> str:
        """For a table's column beside the process count: 'one machine', '2 nodes, 42.0 GB/s busbw',
        '2 emulated nodes, 100 Mbit/s'."""
        if self.kind is Kind.ONE_MACHINE:
            return "one machine"
        if self.kind is Kind.CLUSTER:
            return f"{self.nodes} nodes" + ("" if self.busbw_gb_s is None else f", {self.busbw_gb_s:,.1f} GB/s busbw")
        return f"{self.nodes} emulated nodes, {self._link('unshaped')}"

    def _processes(self) -> str:
        return f"{self.nproc} process{'es' * (self.nproc > 1)}"

    def _model(self) -> str:
        return f"{size_words(self.size)}, " if self.size else ""

    def _link(self, unshaped: str) -> str:
        return unshaped if self.link_mbit is None else f"{self.link_mbit:g} Mbit/s"
