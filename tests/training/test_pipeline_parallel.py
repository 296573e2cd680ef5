"""Pipeline parallelism (pp): how blocks are split into stages, the GPipe schedule against the
single-process curve (1F1B is in test_equivalence.py with the other strategies), a negative
control for the tied embedding, and the splits it refuses."""

from __future__ import annotations

import pytest
from test_equivalence import assert_follows_reference, train_with_fault

from gpt2dist.training.strategies.pipeline_parallel import PipelineParallel, stage_blocks

from conftest import gpt2dist, read_metrics, run_record, train_args

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("stages, sizes", [(1, [12]), (2, [6, 6]), (5, [3, 3, 2, 2, 2]), (8, [2, 2, 2, 2, 1, 1, 1, 1])])
def test_stages_take_contiguous_blocks_as_evenly_as_they_divide(stages, sizes):
    split = stage_blocks(12, stages)
    assert [len(blocks) for blocks in split] == sizes
    assert [b for blocks in split for b in blocks] == list(range(12))


@pytest.mark.timeout(300)
def test_gpipe_follows_single_process(reference, shards, params_file, tmp_path):
    gpt2dist(*train_args(shards, params_file, tmp_path, "pp", "--set", "train.pipeline_schedule=gpipe", nproc=2))
    assert_follows_reference(reference, tmp_path)
    record = run_record(tmp_path)
    assert record["wrapping"] == {"stages": 2, "blocks_per_stage": [1, 1], "schedule": "gpipe", "micro_batches": 4}
    assert record["grad_accum_steps"] == 1  # the whole global batch is one pipeline step


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


def test_refused_pipelines_name_the_fix(shards, params_file, tmp_path):
    fp16 = gpt2dist(*train_args(shards, params_file, tmp_path / "a", "pp", nproc=2, precision="fp16"), check=False)
    assert fp16.returncode == 2 and "use pp with bf16" in fp16.stderr, fp16.stderr
    deep = gpt2dist(*train_args(shards, params_file, tmp_path / "b", "pp", nproc=3), check=False)
    assert deep.returncode == 2 and "use --nproc 2 or fewer" in deep.stderr, deep.stderr
