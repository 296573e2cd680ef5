"""Strategy registry: a strategy's name -> the runtime class of its data-parallel method (config.strategies says
which); tensor and pipeline parallelism are applied by their base class from the run's degrees. Importing a
strategy never imports Horovod or Apex, and looking one up imports only its own module: torch's pipelining and
tensor-parallel modules cost a second or two of start-up that every run of the other strategies would pay (a cpu
study starts about a hundred processes), so only a split that uses them imports them."""

from collections.abc import Iterator, Mapping
from importlib import import_module

from gpt2dist.config.schema import STRATEGY_NAMES
from gpt2dist.config.strategies import describe
from gpt2dist.training.strategies.base import Placement, Strategy

# data-parallel method -> (module in this package, class)
_WHERE = {
    "single": ("single", "Single"),
    "dp": ("dp", "DataParallel"),
    "ddp": ("ddp", "DDP"),
    "fsdp": ("fsdp", "FSDP"),
    "horovod": ("horovod", "Horovod"),
    "apex-ddp": ("apex_ddp", "ApexDDP"),
    "none": ("torch_distributed", "OneReplica"),
    "zero1": ("zero", "ZeRO1"),
    "hsdp": ("fsdp", "HSDP"),
    "zero2": ("fsdp", "ZeRO2"),
}


class _Registry(Mapping[str, type[Strategy]]):
    """Any strategy's name (ddp, tp, ddp-tp2-pp2) looks up its method's class; it lists the named strategies."""

    def __getitem__(self, name: str) -> type[Strategy]:
        module, cls = _WHERE[describe(name).method.name]
        return getattr(import_module(f"{__name__}.{module}"), cls)

    def __iter__(self) -> Iterator[str]:
        return iter(STRATEGY_NAMES)

    def __len__(self) -> int:
        return len(STRATEGY_NAMES)


REGISTRY: Mapping[str, type[Strategy]] = _Registry()

__all__ = ["REGISTRY", "Placement", "Strategy"]
