"""The splits a planner weighs on a cluster: every named strategy and every factorisation of its devices into
data x tensor x pipeline parallel degrees, with each data-parallel method that composes (config.methods)."""

from __future__ import annotations

from gpt2dist.config.methods import METHODS, NONE
from gpt2dist.config.schema import ModelConfig, TrainConfig
from gpt2dist.config.split import composed_name
from gpt2dist.config.strategies import REFERENCE, STRATEGIES


def splits_of(nproc: int, per_node: int, model: ModelConfig, train: TrainConfig) -> list[str]:
    """Every strategy a planner can weigh on `nproc` devices, `per_node` on each node: each named strategy but
    single (those that cannot run here among them, for check_run to say why), and every factorisation
    nproc = dp x tp x pp (tp inside a node and dividing the heads, a block per stage at least) with each
    data-parallel method that composes, or none where dp is 1. A split that is a named strategy's point is named so
    (tp, pp, fsdp-tp)."""
    names = [name for name in STRATEGIES if name != REFERENCE]
    composing = [name for name, method in METHODS.items() if method.composes and method.data_parallel]
    for tp in range(1, min(model.n_head, per_node) + 1):  # a degree divides the heads: counted by them, not the GPUs
        if per_node % tp or model.n_head % tp or nproc % tp:
            continue
        for pp in range(1, min(model.n_layer, nproc // tp) + 1):
            if (tp, pp) == (1, 1) or nproc % (tp * pp):
                continue
            methods = [NONE] if tp * pp == nproc else composing
            names += [named_point(method, tp, pp, nproc, train) for method in methods]
    return list(dict.fromkeys(names))


def named_point(method: str, tp: int, pp: int, nproc: int, train: TrainConfig) -> str:
    """The name a split goes by: a named strategy's where one has these degrees at `nproc`, else its own."""
    for name, d in STRATEGIES.items():
        if d.splits_model and d.method.name == method and d.split.degrees(nproc, train.tensor_parallel_size) == (tp, pp):
            return name
    return composed_name(method, tp, pp)
