"""Strategy.prepare's order: the precision policy gets the optimizer that will step. Apex amp
patches the optimizer object it is given, so under Horovod that must be the DistributedOptimizer
(amp on the bare one, then wrapping, loses amp's per-optimizer state). Real Horovod, one process."""

from __future__ import annotations

import pytest

from gpt2dist.config.presets import load_params
from gpt2dist.launch.runner import build_spec
from gpt2dist.training.loop import optimizer_factory
from gpt2dist.training.model import build_model
from gpt2dist.training.precision import Precision
from gpt2dist.training.strategies.horovod import Horovod


class RecordingPrecision(Precision):
    """fp32 that remembers which optimizer prepare() received."""

    def prepare(self, model, optimizer):
        self.received = optimizer
        return super().prepare(model, optimizer)


@pytest.mark.timeout(120)
def test_horovod_hands_the_precision_its_distributed_optimizer(shards, params_file, tmp_path):
    spec = build_spec(data=shards, out=tmp_path, strategy="horovod", precision="fp32", nproc=1,
                      params=load_params(params_file), preset=None, overrides=[])
    strategy = Horovod(spec)
    placement = strategy.setup()
    try:
        precision = RecordingPrecision("fp32", placement.device, sharded=False)
        model = build_model(spec.model, seed=spec.train.seed)
        _, optimizer = strategy.prepare(model, optimizer_factory(spec.train, precision.fused_optimizer), precision)
        assert precision.received is optimizer and hasattr(optimizer, "synchronize")  # Horovod's, not bare AdamW
    finally:
        strategy.teardown()
