"""Single device: the reference every other strategy must match."""

from gpt2dist.training.strategies.base import Strategy, log_wrapping


class Single(Strategy):

    def prepare(self, model, make_optimizer, precision):
        log_wrapping(self, f"one replica on {self.placement.device}")
        return super().prepare(model, make_optimizer, precision)
