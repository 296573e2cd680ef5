"""A configuration: what a study measures repeatedly and compares, a strategy in a precision at a placement (its
processes, nodes, link and model size). Its id (run ids, tables, figures) and its name in prose are made here only;
where it runs is its Placement's to decide and word."""

from __future__ import annotations

from dataclasses import dataclass

from gpt2dist.config.placement import Placement


@dataclass(frozen=True)
class Configuration:
    strategy: str
    precision: str
    placement: Placement

    @classmethod
    def of(cls, row: dict) -> Configuration:
        """A summary's, a plan's or a run table's row."""
        return cls(row["strategy"], row["precision"], Placement.of(row))

    @property
    def id(self) -> str:
        """ddp-bf16-n8, at a model size of the study's ddp-bf16-n8-medium, on a cluster's nodes ddp-bf16-n8-2nodes and
        on emulated ones with a shaped link ddp-bf16-n8-2nodes-100mbit."""
        where = self.placement
        base = f"{self.strategy}-{self.precision}-n{where.nproc}" + (f"-{where.size}" if where.size else "")
        if where.nodes == 1:
            return base
        return f"{base}-{where.nodes}nodes" + (f"-{where.link_mbit:g}mbit" if where.link_mbit else "")

    def name(self) -> str:
        return configuration_name(self.strategy, self.precision)

    def name_with_processes(self) -> str:
        """Its name where the placement is not said around it: 'ddp bf16 x2'."""
        return f"{self.name()} x{self.placement.nproc}"


def configuration_name(strategy: str, precision: str) -> str:
    """A configuration's name beside its placement's words (a tier of the answer, a figure's row): 'ddp bf16'. Apart
    from Configuration for rows that carry no placement (the answer's ranked rows)."""
    return f"{strategy} {precision}"


def config_id(strategy: str, precision: str, nproc: int, nodes: int = 1, link_mbit: float | None = None,
              size: str | None = None) -> str:
    """The id of the configuration these make up (Configuration.id), for callers that hold them apart."""
    return Configuration(strategy, precision, Placement(nproc, nodes, link_mbit=link_mbit, size=size)).id
