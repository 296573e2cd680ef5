"""Strategy registry: name -> class. Importing a strategy never imports Horovod or Apex."""

from gpt2dist.strategies.base import Placement, Strategy
from gpt2dist.strategies.ddp import DDP
from gpt2dist.strategies.dp import DataParallel
from gpt2dist.strategies.fsdp import FSDP
from gpt2dist.strategies.horovod import Horovod
from gpt2dist.strategies.single import Single

REGISTRY: dict[str, type[Strategy]] = {cls.name: cls for cls in (Single, DataParallel, DDP, FSDP, Horovod)}

__all__ = ["REGISTRY", "Placement", "Strategy"]
