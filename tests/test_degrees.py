"""The one place a run's degrees are checked (config.degrees): every refusal names the setting to change, and
the same run with that setting changed as the message says passes (the control beside each refusal). What torch's
pipeline schedules cannot run is refused apart (validate_schedule): other engines run it, and the planner prices
it."""

from __future__ import annotations

import pytest

from gpt2dist.config.schema import ModelConfig, RunSpec, TrainConfig
from gpt2dist.config.strategies import check_run, describe
from gpt2dist.errors import UsageError

from conftest import TINY_PRESET

MODEL = ModelConfig(**TINY_PRESET["model"])  # 2 blocks, 2 heads
TRAIN = TrainConfig(**TINY_PRESET["train"])  # a global batch of 8 in micro-batches of 2


def validate(strategy: str, nproc: int, model: dict | None = None, **train) -> None:
    m, t = MODEL.model_copy(update=model or {}), TRAIN.model_copy(update=train)
    degrees = describe(strategy).degrees(nproc, t)
    degrees.validate(m, t)
    degrees.validate_schedule(t)


# (strategy, nproc, model, train) refused, the message, and the same run fixed as the message says
CASES = {
    "fsdp-tp's tensor ranks do not divide nproc": (
        ("fsdp-tp", 3, None, {}), "needs --nproc (3) divisible by train.tensor_parallel_size (2); use --nproc 4",
        ("fsdp-tp", 4, None, {})),
    "hsdp's shard groups do not divide nproc": (
        ("hsdp", 3, None, {"data_parallel_shard_size": 2}),
        "needs --nproc (3) divisible by train.data_parallel_shard_size (2); use --nproc 4",
        ("hsdp", 4, None, {"data_parallel_shard_size": 2})),
    "tp's ranks do not divide the heads": (
        ("tp", 4, None, {}), "tp splits attention heads over 4 ranks, but model.n_head (2) is not divisible by 4; "
                             "use a process count that divides 2",
        ("tp", 2, None, {})),
    "fsdp-tp's tensor ranks do not divide the heads": (
        ("fsdp-tp", 4, None, {"tensor_parallel_size": 4}),
        "use a train.tensor_parallel_size that divides 2", ("fsdp-tp", 4, None, {"tensor_parallel_size": 2})),
    "more pipeline stages than blocks": (
        ("pp", 4, None, {}), "puts at least one block on each of its 4 stages, but the model has 2 (model.n_layer); "
                             "use --nproc 2 or fewer", ("pp", 2, None, {})),
    "more interleaved stages than blocks": (
        ("pp", 2, None, {"pipeline_schedule": "interleaved-1f1b"}),
        "2 x 2 stages (train.pipeline_virtual_stages), but the model has 2 (model.n_layer); use --nproc 1 or fewer",
        ("pp", 2, {"n_layer": 4}, {"pipeline_schedule": "interleaved-1f1b"})),
    "fewer micro-batches than 1F1B's stages": (
        ("pp", 2, None, {"global_batch_size": 2}), "needs at least one micro-batch per stage",
        ("pp", 2, None, {"global_batch_size": 2, "pipeline_schedule": "gpipe"})),
    "micro-batches that interleaving's rounds do not divide": (
        ("pp", 2, {"n_layer": 4}, {"pipeline_schedule": "interleaved-1f1b", "global_batch_size": 5,
                                   "micro_batch_size": 1}),
        "runs the 5 micro-batches in 2 equal rounds, which they do not divide into; use a global batch of 4 or 6",
        ("pp", 2, {"n_layer": 4}, {"pipeline_schedule": "interleaved-1f1b", "global_batch_size": 6,
                                   "micro_batch_size": 1})),
    "a batch the data-parallel ranks do not divide": (
        ("ddp", 3, None, {}), "train.global_batch_size (8) must be divisible by nproc x train.micro_batch_size "
                              "(3 x 2 = 6)", ("ddp", 4, None, {})),
    "a batch fsdp-tp's replicas do not divide": (
        ("fsdp-tp", 6, None, {}), "must be divisible by nproc / train.tensor_parallel_size x train.micro_batch_size "
                                  "(3 x 2 = 6)", ("fsdp-tp", 8, None, {})),
    "a batch dp's devices do not divide": (
        ("dp", 3, None, {}), "must be divisible by nproc x train.micro_batch_size (3 x 2 = 6)", ("dp", 2, None, {})),
}


@pytest.mark.parametrize("case", CASES)
def test_each_refusal_names_the_setting_and_the_fix_passes(case):
    (strategy, nproc, model, train), message, (fixed_strategy, fixed_nproc, fixed_model, fixed_train) = CASES[case]
    with pytest.raises(UsageError) as refused:
        validate(strategy, nproc, model, **train)
    assert message in str(refused.value)
    validate(fixed_strategy, fixed_nproc, fixed_model, **fixed_train)  # the control: no refusal


def test_check_run_is_where_a_run_meets_the_check():
    """The launcher's and the planner's check (check_run) refuses what the degrees refuse, and passes the rest."""
    def spec(nproc: int) -> RunSpec:
        return RunSpec(data_dir="", out_dir="", preset="tiny", strategy="fsdp-tp", precision="fp32", nproc=nproc,
                       device="cpu", model=MODEL, train=TRAIN)

    with pytest.raises(UsageError, match=r"divisible by train.tensor_parallel_size \(2\)"):
        check_run(spec(3), visible_gpus=0)
    check_run(spec(4), visible_gpus=0)


def test_the_degrees_say_how_each_strategy_cuts_the_devices():
    t = TRAIN.model_copy(update={"data_parallel_shard_size": 2, "tensor_parallel_size": 2})
    cut = {name: describe(name).degrees(4, t) for name in ("ddp", "fsdp", "hsdp", "fsdp-tp", "tp", "pp", "dp")}
    as_tuples = {name: (d.dp_replicate, d.dp_shard, d.tp, d.pp) for name, d in cut.items()}
    assert as_tuples == {"ddp": (4, 1, 1, 1), "fsdp": (1, 4, 1, 1), "hsdp": (2, 2, 1, 1), "fsdp-tp": (1, 2, 2, 1),
                         "tp": (1, 1, 4, 1), "pp": (1, 1, 1, 4), "dp": (4, 1, 1, 1)}
    # one process reads for dp's four devices; a pipeline step takes the whole batch
    assert (cut["dp"].processes, cut["dp"].batch_shares, cut["dp"].rows_per_pass) == (1, 1, 8)
    assert (cut["pp"].rows_per_pass, cut["pp"].grad_accum_steps, cut["pp"].pipeline_micro_batches) == (8, 1, 4)
    assert (cut["fsdp-tp"].batch_shares, cut["fsdp-tp"].grad_accum_steps) == (2, 2)
