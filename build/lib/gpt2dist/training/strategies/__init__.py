"""Strategy registry: name -> class. Importing a strategy never imports Horovod or Apex."""

from gpt2dist.training.strategies.apex_ddp import ApexDDP
from gpt2dist.training.strategies.base import Placement, Strategy
from gpt2dist.training.strategies.ddp import DDP
from gpt2dist.training.strategies.dp import DataParallel
from gpt2dist.training.strategies.fsdp import FSDP
from gpt2dist.training.strategies.horovod import Horovod
from gpt2dist.training.strategies.pipeline_parallel import PipelineParallel
from gpt2dist.training.strategies.single import Single
from gpt2dist.training.strategies.tensor_parallel import FSDPTensorParallel, TensorParallel

REGISTRY: dict[str, type[Strategy]] = {cls.name: cls for cls in (
    Single, DataParallel, DDP, FSDP, Horovod, ApexDDP, TensorParallel, PipelineParallel, FSDPTensorParallel,
)}

__all__ = ["REGISTRY", "Placement", "Strategy"]
