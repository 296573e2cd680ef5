"""Pipeline parallelism (pp): how blocks are split into stages, GPipe, a three-stage pipeline and the
interleaved schedules (interleaved 1F1B, zero-bubble) against the single-process curve (two-stage 1F1B
is in test_equivalence.py with the other strategies), checkpoints in single's portable form, bf16,
negative controls for the tied embedding, a kill-and-resume with two stages per rank, and the pipelines
it refuses."""

from __future__ import annotations

import pytest
import torch
from test_equivalence import assert_follows_in_precision, assert_follows_reference, train_with_fault
from gpt2dist.config.memory import predict
from gpt2dist.config.schema import RunSpec
from gpt2dist.config.geometry import rank_blocks, stage_blocks
from gpt2dist.training.strategies.torch_distributed import TorchDistributed

from conftest import (RESUME_EXTRA, RESUME_STEPS, assert_resumed_exactly, gpt2dist, kill_after_checkpoint, kill_point,
                      read_metrics, run_record, train_args, train_in_forked_ranks)

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("stages, sizes", [(1, [12]), (2, [6, 6]), (5, [3, 3, 2, 2, 2]), (8, [2, 2, 2, 2, 1, 1, 1, 1])])
def test_stages_take_contiguous_blocks_as_evenly_as_they_divide(stages, sizes):
    split = stage_blocks(12, stages)
    assert [len(blocks) for blocks in split] == sizes
    assert [b for blocks in split for b in blocks] == list(range(12))


@pytest.fixture(scope="module")
def gpipe(shards, params_file, tmp_path_factory):
    out = tmp_path_factory.mktemp("gpipe")
    train_in_forked_ranks(shards, params_file, out, "pp", "--set", "train.pipeline_schedule=gpipe", nproc=2)
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
def test_three_stages_follow_single_process(deeper_single, shards, params_file, tmp_path):
    """4 blocks over 3 stages: an uneven split, and a middle stage outside the tied weight's group."""
    pp = tmp_path / "pp"
    train_in_forked_ranks(shards, params_file, pp, "pp", "--set", "model.n_layer=4", nproc=3)
    assert_follows_reference(deeper_single(4), pp)
    assert run_record(pp)["wrapping"]["blocks_per_stage"] == [2, 1, 1]


@pytest.mark.timeout(300)
def test_bf16_pipeline_follows_single_in_bf16(single_in, trained):
    run = trained("pp", nproc=2, precision="bf16")  # the run pp's kill-and-resume compares with
    assert_follows_in_precision(single_in("fp32"), single_in("bf16"), run)
    low, full = read_metrics(run), read_metrics(single_in("fp32"))
    assert max(abs(a["loss"] - b["loss"]) for a, b in zip(low, full, strict=True)) > 1e-6  # autocast in the stages
    assert low[-1]["loss"] < 0.95 * low[0]["loss"]
    assert all(0 < line["val_loss"] < 10 for line in read_metrics(run, "eval"))


class UntiedPipeline(TorchDistributed):
    """The embedding and head copies never sum their gradients: each stage trains its own copy."""

    def prepare(self, model, make_optimizer, precision):
        prepared = super().prepare(model, make_optimizer, precision)
        self.pipeline.tied_copy = lambda: None
        return prepared


@pytest.mark.timeout(300)
def test_comparison_catches_an_untied_embedding(reference, shards, params_file, tmp_path):
    train_with_fault("pp", UntiedPipeline, shards, params_file, tmp_path)
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
    (("--set", "train.pipeline_schedule=interleaved-1f1b"), "fp32", 2, "use --nproc 1 or fewer, or fewer virtual stages"),
    (("--set", "train.pipeline_schedule=zero-bubble", "--set", "model.n_layer=6", "--set", "train.micro_batch_size=1",
      "--set", "train.global_batch_size=10"), "fp32", 3, "use a global batch of 9 or 12 micro-batches"),
])
def test_refused_pipelines_name_the_fix(extra, precision, nproc, expected, shards, params_file, tmp_path):
    result = gpt2dist(*train_args(shards, params_file, tmp_path, "pp", *extra, nproc=nproc, precision=precision),
                      check=False)
    assert result.returncode == 2 and expected in result.stderr, result.stderr
    assert not (tmp_path / "run.json").exists()


INTERLEAVED = [("interleaved-1f1b", 2), ("zero-bubble", 2), ("interleaved-1f1b", 4), ("zero-bubble", 4)]


@pytest.fixture
def deeper_single(trained):
    """single's run of a model with a block for each of 2 virtual stages on up to 4 ranks, per depth."""
    return lambda n_layer: trained("single", "--set", f"model.n_layer={n_layer}")


@pytest.mark.timeout(400)
@pytest.mark.parametrize("schedule, nproc", INTERLEAVED, ids=[f"{s}-n{n}" for s, n in INTERLEAVED])
def test_interleaved_schedules_follow_single_process(schedule, nproc, deeper_single, trained):
    """Two stages per rank (rank r: stages r and r + nproc), interleaved 1F1B and the zero-bubble schedule
    (backward split into input and weight gradients), against single's run of the same depth. (zero-bubble's
    2-rank run is the one its kill-and-resume compares with.)"""
    n_layer = 2 * nproc
    run = trained("pp", "--set", f"model.n_layer={n_layer}", "--set", f"train.pipeline_schedule={schedule}",
                  nproc=nproc)
    assert_follows_reference(deeper_single(n_layer), run)
    record = run_record(run)
    assert record["wrapping"] == {"stages": 2 * nproc, "blocks_per_stage": [1] * 2 * nproc, "schedule": schedule,
                                  "micro_batches": 4}
    # rank 0 holds the embeddings and blocks 0 and nproc, predicted to the byte
    spec = RunSpec.model_validate(record["config"])
    assert predict(spec).state == record["model_state_bytes"]["total"]
    assert rank_blocks(spec, 0) == [0, nproc]


@pytest.mark.timeout(400)
def test_comparison_catches_an_untied_embedding_under_zero_bubble(deeper_single, shards, params_file, tmp_path):
    """The control for the interleaved schedules: the same untied-embedding fault, under zero-bubble's split
    backward, leaves the curve from the second step."""
    train_with_fault("pp", UntiedPipeline, shards, params_file, tmp_path,
                     overrides=["model.n_layer=4", "train.pipeline_schedule=zero-bubble"])
    ours, theirs = read_metrics(tmp_path), read_metrics(deeper_single(4))
    assert ours[0]["loss"] == pytest.approx(theirs[0]["loss"], rel=1e-6)
    assert ours[1]["loss"] != pytest.approx(theirs[1]["loss"], rel=1e-6)


@pytest.mark.timeout(420)
def test_a_zero_bubble_pipeline_resumes_to_the_same_state(trained, shards, params_file, tmp_path):
    """Bitwise after SIGKILL, as every strategy (test_train_cli): two stages per rank restore from single's
    portable checkpoint into the right stages."""
    extra = ("--set", "model.n_layer=4", "--set", "train.pipeline_schedule=zero-bubble")
    whole, killed = trained("pp", *extra, nproc=2), tmp_path / "killed"
    args = train_args(shards, params_file, killed, "pp", *extra, *RESUME_EXTRA, nproc=2)
    kill_after_checkpoint(args, killed, kill_point("pp-zero-bubble-2"))
    gpt2dist(*args)
    record = run_record(killed)
    assert record["status"] == "completed" and 0 < record["resumed_from_step"] < RESUME_STEPS
    assert_resumed_exactly(killed, whole)


@pytest.mark.timeout(400)
def test_the_chunked_loss_on_the_last_stage_follows_single_under_zero_bubble(deeper_single, shards, params_file,
                                                                             tmp_path):
    """train.head_loss_chunk_tokens reaches the last stage's head, whose gradients the chunked loss computes in
    its forward: zero-bubble's split backward (input gradients, then weight gradients) still gets both."""
    train_in_forked_ranks(shards, params_file, tmp_path, "pp", "--set", "model.n_layer=4", "--set",
                          "train.pipeline_schedule=zero-bubble", "--set", "train.head_loss_chunk_tokens=24", nproc=2)
    assert_follows_reference(deeper_single(4), tmp_path)
