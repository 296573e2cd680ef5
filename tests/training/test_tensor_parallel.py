"""Tensor parallelism (tp) and FSDP x TP (fsdp-tp): the fused q/k/v split, the 2-D run against the
single-process curve, and negative controls that a broken split cannot pass. (tp's 2-rank
equivalence run is in test_equivalence.py with the other strategies.)"""

from __future__ import annotations

import pytest
import torch
from test_equivalence import RTOL, SummingFSDP, assert_follows_reference, train_with_fault
from torch.distributed.tensor import Partial
from torch.distributed.tensor.parallel import RowwiseParallel

from gpt2dist.training.strategies import tensor_parallel
from gpt2dist.training.strategies.tensor_parallel import qkv_order
from gpt2dist.training.strategies.torch_distributed import TorchDistributed

from conftest import gpt2dist, read_metrics, run_record, train_args

# fsdp-tp's run against single's is the fast tier; the fault-injected controls are slow


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_qkv_order_gives_each_rank_its_own_heads_of_q_k_and_v(tp):
    width = 8
    rows = qkv_order(width, tp)
    assert sorted(rows.tolist()) == list(range(3 * width))
    for rank, chunk in enumerate(rows.chunk(tp)):  # what a column split hands rank `rank`
        mine = torch.arange(rank * width // tp, (rank + 1) * width // tp)
        assert chunk.tolist() == torch.cat([mine, mine + width, mine + 2 * width]).tolist()


@pytest.mark.slow  # four ranks on the machine's cores
@pytest.mark.timeout(300)
def test_fsdp_tp_on_four_ranks_follows_single_process(reference, trained):
    """2 FSDP replicas x 2 tensor-parallel ranks: each replica reads half the batch, each rank a quarter of
    the block matrices, sharded again over the replicas."""
    run = trained("fsdp-tp", nproc=4)
    assert_follows_reference(reference, run)
    record = run_record(run)
    assert record["wrapping"] == {"tensor_parallel": 2, "parallel_blocks": 2, "fully_shard_modules": 3,
                                  "param_dtype": "float32", "reduce_dtype": "float32", "mesh": {"dp_shard": 2}}
    assert record["grad_accum_steps"] == 2  # global 8 = 2 replicas x 2 rows x 2 micro-steps
    held = record["model_state_bytes"]["total"] / run_record(reference)["model_state_bytes"]["total"]
    assert 0.25 <= held < 0.5  # FSDP halves everything; TP halves the block matrices again


@pytest.mark.timeout(300)
def test_refused_splits_name_the_fix(shards, params_file, tmp_path):
    three = gpt2dist(*train_args(shards, params_file, tmp_path / "a", "fsdp-tp", nproc=3), check=False)
    assert three.returncode == 2 and "divisible by train.tensor_parallel_size (2)" in three.stderr, three.stderr
    heads = gpt2dist(*train_args(shards, params_file, tmp_path / "b", "tp", "--set", "model.n_head=1", nproc=2),
                     check=False)
    assert heads.returncode == 2 and "model.n_head (1) is not divisible by 2" in heads.stderr, heads.stderr
    assert not (tmp_path / "a" / "run.json").exists() and not (tmp_path / "b" / "run.json").exists()


# --- negative controls: the comparison must catch a broken split ----------------------

def _unreduced_rowwise():
    """The row-parallel projection's partial sums left unreduced: each rank keeps only its shard's share."""
    return RowwiseParallel(output_layouts=Partial())


def _leave_row_parallel_sums_unreduced() -> None:
    tensor_parallel.RowwiseParallel = _unreduced_rowwise


def _split_fused_qkv_as_is() -> None:
    """Rank 0 gets all of q and half of k."""
    tensor_parallel.qkv_order = lambda width, tp: torch.arange(3 * width)


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("fault", ["dropped-shard", "fused-qkv-split-as-is"])
def test_comparison_catches_a_broken_split(fault, reference, shards, params_file, tmp_path):
    inject = {"dropped-shard": _leave_row_parallel_sums_unreduced, "fused-qkv-split-as-is": _split_fused_qkv_as_is}
    train_with_fault("tp", TorchDistributed, shards, params_file, tmp_path, inject=inject[fault])
    with pytest.raises(AssertionError):
        assert_follows_reference(reference, tmp_path)
    # from the first step on: at the initial weights attention is nearly uniform, so the loss moves only a
    # little, but beyond the tolerance a correct split stays within
    assert read_metrics(tmp_path)[0]["loss"] != pytest.approx(read_metrics(reference)[0]["loss"], rel=RTOL)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_comparison_catches_fsdp_tp_summing_over_its_replicas(reference, shards, params_file, tmp_path):
    # fsdp-tp whose FSDP reduce-scatter over the replicas sums instead of averaging
    train_with_fault("fsdp-tp", SummingFSDP, shards, params_file, tmp_path, nproc=4)
    with pytest.raises(AssertionError):
        assert_follows_reference(reference, tmp_path)
    # the same weights at step 0, the gradient of 2 replicas summed: exactly twice the averaged norm
    assert read_metrics(tmp_path)[0]["grad_norm"] / read_metrics(reference)[0]["grad_norm"] == pytest.approx(2.0,
                                                                                                            rel=1e-4)
