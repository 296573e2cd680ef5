"""Pipeline parallelism (pp): how blocks are split into stages, GPipe and a three-stage pipeline
against the single-process curve (two-stage 1F1B is in test_equivalence.py with the other
strategies), checkpoints in single's portable form, bf16, a negative control for the tied
embedding, and the pipelines it refuses."""

from __future__ import annotations

import pytest
import torch
from test_equivalence import assert_follows_in_precision, assert_follows_reference, train_with_fault

from gpt2dist.config.strategies import stage_blocks
from gpt2dist.training.strategies.pipeline_parallel import PipelineParallel

from conftest import gpt2dist, read_metrics, run_record, train_args

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("stages, sizes", [(1, [12]), (2, [6, 6]), (5, [3, 3, 2, 2, 2]), (8, [2, 2, 2, 2, 1, 1, 1, 1])])
def test_stages_take_contiguous_blocks_as_evenly_as_they_divide(stages, sizes):
    split = stage_blocks(12, stages)
    assert [len(blocks) for blocks in split] == sizes
    assert [b for blocks in split for b in blocks] == list(range(12))


@pytest.fixture(scope="module")
def gpipe(shards, params_file, tmp_path_factory):
    out = tmp_path_factory.mktemp("gpipe")
    gpt2dist(*train_args(shards, params_file, out, "pp", "--set", "train.pipeline_schedule=gpipe", nproc=2))
    return out


@pytest.mark.timeout(300)
def test_gpipe_follows_single_process(reference, gpipe):
    assert_follows_reference(reference, gpipe)
    # evaluation passes micro-batches stage to stage outside the schedule
    val_losses = [[line["val_loss"] for line in read_metrics(run, "eval")] for run in (gpipe, reference)]
    assert val_losses[0] == pytest.approx(val_losses[1], rel=1e-5)
    record = run_record(gpipe)
    assert record["wrapping"] == {"stages": 2, "blocks_per_stage": [1, 1], "schedule": "gpipe", "micro_batches": 4}
    assert record["grad_accum_steps"] == 1  # the whole global batch is one pipeline step


def _layout(state: dict) -> dict:
    return {name: (value.shape, value.dtype) for name, value in state.items()}


@pytest.mark.timeout(300)
def test_checkpoint_is_single_s_portable_state(reference, gpipe):
    """The stages' parts gathered under the full model's names: model and optimizer state as `single` writes them."""
    ours, theirs = (torch.load(run / "checkpoint.pt", weights_only=False) for run in (gpipe, reference))
    assert _layout(ours["model"]) == _layout(theirs["model"])
    # the head's copy (last stage) and the embedding (first stage) stepped alike to the last bit
    assert torch.equal(ours["model"]["lm_head.weight"], ours["model"]["transformer.wte.weight"])
    optim, single_optim = ours["optimizer"], theirs["optimizer"]
    assert {name: _layout(s) for name, s in optim["state"].items()} == \
        {name: _layout(s) for name, s in single_optim["state"].items()}
    assert optim["param_groups"] == single_optim["param_groups"]  # by name, the tied weight once


@pytest.mark.timeout(300)
def test_three_stages_follow_single_process(shards, params_file, tmp_path):
    """4 blocks over 3 stages: an uneven split, and a middle stage outside the tied weight's group."""
    deeper = ("--set", "model.n_layer=4")
    single, pp = tmp_path / "single", tmp_path / "pp"
    gpt2dist(*train_args(shards, params_file, single, "single", *deeper))
    gpt2dist(*train_args(shards, params_file, pp, "pp", *deeper, nproc=3))
    assert_follows_reference(single, pp)
    assert run_record(pp)["wrapping"]["blocks_per_stage"] == [2, 1, 1]


@pytest.mark.timeout(300)
def test_bf16_pipeline_follows_single_in_bf16(single_in, shards, params_file, tmp_path):
    gpt2dist(*train_args(shards, params_file, tmp_path, "pp", nproc=2, precision="bf16"))
    assert_follows_in_precision(single_in("fp32"), single_in("bf16"), tmp_path)
    low, full = read_metrics(tmp_path), read_metrics(single_in("fp32"))
    assert max(abs(a["loss"] - b["loss"]) for a, b in zip(low, full, strict=True)) > 1e-6  # autocast in the stages
    assert low[-1]["loss"] < 0.95 * low[0]["loss"]
    assert all(0 < line["val_loss"] < 10 for line in read_metrics(tmp_path, "eval"))


class UntiedPipeline(PipelineParallel):
    """The embedding and head copies never sum their gradients: each stage trains its own copy."""

    def _tied_copy(self):
        return None


@pytest.mark.timeout(300)
def test_comparison_catches_an_untied_embedding(reference, shards, params_file, tmp_path):
    train_with_fault(UntiedPipeline, shards, params_file, tmp_path)
    with pytest.raises(AssertionError):
        assert_follows_reference(reference, tmp_path)
    # the first step starts from equal copies; the second already sees them apart
    ours, theirs = read_metrics(tmp_path), read_metrics(reference)
    assert ours[0]["loss"] == pytest.approx(theirs[0]["loss"], rel=1e-6)
    assert ours[1]["loss"] != pytest.approx(theirs[1]["loss"], rel=1e-6)


@pytest.mark.parametrize("extra, precision, nproc, expected", [
    ((), "fp16", 2, "use pp with bf16"),
    ((), "fp32", 3, "use --nproc 2 or fewer"),
    (("--set", "train.micro_batch_size=8"), "fp32", 2, "or train.pipeline_schedule=gpipe"),
])
def test_refused_pipelines_name_the_fix(extra, precision, nproc, expected, shards, params_file, tmp_path):
    result = gpt2dist(*train_args(shards, params_file, tmp_path, "pp", *extra, nproc=nproc, precision=precision),
                      check=False)
    assert result.returncode == 2 and expected in result.stderr, result.stderr
    assert not (tmp_path / "run.json").exists()
