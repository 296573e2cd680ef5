"""Strategy registry: name -> class. Importing a strategy never imports Horovod or Apex, and looking one
up imports only its own module: torch's pipelining and tensor-parallel modules cost a second or two of
start-up that every run of the other strategies would pay (a cpu study starts about a hundred processes)."""

from collections.abc import Iterator, Mapping
from importlib import import_module

from gpt2dist.training.strategies.base import Placement, Strategy

# name -> (module in this package, class)
_WHERE = {
    "single": ("single", "Single"),
    "dp": ("dp", "DataParallel"),
    "ddp": ("ddp", "DDP"),
    "fsdp": ("fsdp", "FSDP"),
    "horovod": ("horovod", "Horovod"),
    "apex-ddp": ("apex_ddp", "ApexDDP"),
    "tp": ("tensor_parallel", "TensorParallel"),
    "pp": ("pipeline_parallel", "PipelineParallel"),
    "fsdp-tp": ("tensor_parallel", "FSDPTensorParallel"),
    "zero1": ("zero", "ZeRO1"),
    "hsdp": ("fsdp", "HSDP"),
    "zero2": ("fsdp", "ZeRO2"),
}


class _Registry(Mapping[str, type[Strategy]]):
    def __getitem__(self, name: str) -> type[Strategy]:
        module, cls = _WHERE[name]
        return getattr(import_module(f"{__name__}.{module}"), cls)

    def __iter__(self) -> Iterator[str]:
        return iter(_WHERE)

    def __len__(self) -> int:
        return len(_WHERE)


REGISTRY: Mapping[str, type[Strategy]] = _Registry()

__all__ = ["REGISTRY", "Placement", "Strategy"]
