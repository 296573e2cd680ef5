"""ZeRO's stages, HSDP and activation checkpointing follow single's loss curve (fp32, the equivalence
tolerance) at 2 and 4 processes, and hold the model state they are said to:
- zero1: DDP's all-reduce, AdamW's state partitioned over ranks (ZeroRedundancyOptimizer);
- zero2: FSDP2 keeping gathered parameters from forward to backward and reducing every micro-step;
- hsdp: the state sharded within groups of train.data_parallel_shard_size ranks, replicated across them
  (2 processes in shard groups of one: replication alone; 4 processes as 2 x 2: both);
- activation checkpointing (train.activation_checkpointing=block): the same arithmetic, recomputed.
Each claim has its control beside it: gradients summed instead of averaged leave the curve by the factor
the ranks that add them make; ZeRO-1 without its parameter broadcast leaves it too."""

from __future__ import annotations

import pytest
from test_equivalence import SummingDDP, SummingFSDP, assert_follows_reference, train_with_fault
from torch.distributed.optim import ZeroRedundancyOptimizer

from gpt2dist.training.strategies.ddp import DDP

from conftest import assert_same_losses, read_metrics, run_record

SHARD_1 = ("--set", "train.data_parallel_shard_size=1")
CHECKPOINTED = ("--set", "train.activation_checkpointing=block")
# (strategy, extra train arguments, processes) -> the share of single's model state rank 0 holds
VARIANTS = {
    ("zero1", (), 2): None,  # parameters and gradients whole, AdamW's moments of whole tensors (below)
    ("zero1", (), 4): None,
    ("hsdp", SHARD_1, 2): 1.0,  # shard groups of one rank: every rank holds the whole state
    ("hsdp", (), 4): 0.5,  # 2 groups of 2: half
    ("zero2", (), 2): 0.5,
    ("zero2", (), 4): 0.25,
}


# The fast tier (`pytest -m "not slow"`) trains the 2-process runs; those of 4 processes, 2 cores each, are slow
CASES = [pytest.param(s, e, n, id=f"{s}-n{n}{'-shard1' if e else ''}", marks=[pytest.mark.slow] if n > 2 else [])
         for s, e, n in VARIANTS]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("strategy, extra, nproc", CASES)
def test_each_follows_single_process(strategy, extra, nproc, reference, trained):
    run = trained(strategy, *extra, nproc=nproc)
    assert_follows_reference(reference, run)
    losses = [line["loss"] for line in read_metrics(run)]
    assert losses[-1] < 0.9 * losses[0]
    record, single = run_record(run), run_record(reference)
    mine, whole = record["model_state_bytes"], single["model_state_bytes"]
    if strategy == "zero1":
        # whole tensors go to ranks, largest first: rank 0 holds part of AdamW's state, the embedding's at least
        # (tests/test_memory.py checks it to the byte)
        assert mine["params"] == whole["params"] and mine["grads"] == whole["grads"]
        assert 0 < mine["optimizer"] / whole["optimizer"] < 1
    else:
        assert mine["total"] / whole["total"] == pytest.approx(VARIANTS[strategy, extra, nproc], rel=0.02)
    wrapping = record["wrapping"]
    if strategy == "hsdp":
        shard = 1 if extra else 2
        assert wrapping["mesh"] == {"dp_replicate": nproc // shard, "dp_shard": shard}


@pytest.mark.slow
@pytest.mark.timeout(400)
@pytest.mark.parametrize("strategy, faulty, nproc", [("zero1", SummingDDP, 2), ("zero2", SummingFSDP, 2),
                                                     ("hsdp", SummingFSDP, 4)], ids=["zero1-n2", "zero2-n2", "hsdp-n4"])
def test_summed_gradients_leave_the_curve_by_the_ranks_that_add_them(strategy, faulty, nproc, reference, shards,
                                                                      params_file, tmp_path):
    """The control: every rank's gradient added, not averaged, over the shard group and the replicas
    (HSDP's reduce-scatter and all-reduce both), makes step 0's gradient norm nproc times single's."""
    train_with_fault(strategy, faulty, shards, params_file, tmp_path, nproc=nproc)
    first_ref, first_run = read_metrics(reference)[0], read_metrics(tmp_path)[0]
    assert first_run["grad_norm"] / first_ref["grad_norm"] == pytest.approx(nproc, rel=1e-4)
    with pytest.raises(AssertionError):
        assert_follows_reference(reference, tmp_path)


def _no_parameter_broadcast() -> None:
    ZeroRedundancyOptimizer._sync_params = lambda self: None


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_zero1_without_its_broadcast_leaves_the_curve(reference, shards, params_file, tmp_path):
    """The control of ZeRO-1's own step: a rank that steps only its partition and never receives the others'
    trains half a model; the first step agrees (same weights), the second no longer does."""
    train_with_fault("zero1", DDP, shards, params_file, tmp_path, inject=_no_parameter_broadcast)
    ref, run = read_metrics(reference), read_metrics(tmp_path)
    assert run[0]["loss"] == pytest.approx(ref[0]["loss"], rel=1e-6)
    assert run[1]["loss"] != pytest.approx(ref[1]["loss"], rel=1e-4)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("strategy, nproc", [("single", 1), pytest.param("fsdp", 2, marks=pytest.mark.slow),
                                             pytest.param("tp", 2, marks=pytest.mark.slow)])
def test_activation_checkpointing_computes_the_same_curve(strategy, nproc, reference, trained):
    """Recomputing a block in backward repeats its forward's arithmetic: single's curve to the fp32 bound,
    under FSDP2's hooks and DTensor's too."""
    run = trained(strategy, *CHECKPOINTED, nproc=nproc)
    assert_same_losses(trained(strategy, nproc=nproc), run)
    assert_follows_reference(reference, run)
    assert run_record(run)["config"]["train"]["activation_checkpointing"] == "block"

