"""Strategy registry: a strategy's name -> the runtime class of the engine that runs it (config.methods' records
name it: torch's one path, or an engine of its own); tensor and pipeline parallelism are applied by the torch path
from the run's degrees. Importing a strategy never imports Horovod or Apex, and looking one up imports only its
own module: torch's pipelining and tensor-parallel modules cost a second or two of start-up that every run of the
other strategies would pay (a cpu study starts about a hundred processes), so only a split that uses them imports
them."""

from collections.abc import Iterator, Mapping
from importlib import import_module

from gpt2dist.config.schema import STRATEGY_NAMES
from gpt2dist.config.strategies import describe
from gpt2dist.training.strategies.base import Placement, Strategy


def runtime_class(runtime: str) -> type[Strategy]:
    """An engine record's runtime ("module:Class" in this package), imported."""
    module, cls = runtime.split(":")
    return getattr(import_module(f"{__name__}.{module}"), cls)


class _Registry(Mapping[str, type[Strategy]]):
    """Any strategy's name (ddp, tp, ddp-tp2-pp2) looks up its engine's class; it lists the named strategies."""

    def __getitem__(self, name: str) -> type[Strategy]:
        return runtime_class(describe(name).engine.runtime)

    def __iter__(self) -> Iterator[str]:
        return iter(STRATEGY_NAMES)

    def __len__(self) -> int:
        return len(STRATEGY_NAMES)


REGISTRY: Mapping[str, type[Strategy]] = _Registry()

__all__ = ["REGISTRY", "Placement", "Strategy", "runtime_class"]
