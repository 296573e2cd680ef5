"""Model size as a study axis: a run group's `sizes` train it at GPT-2's published shapes or a study's own, each
size's runs have their own ids, the planner drops what the study's GPUs cannot hold and says why, and a bad size
is one error naming the fix."""

from __future__ import annotations

import copy

import pytest
import yaml

from gpt2dist.config.presets import load_params
from gpt2dist.config.sizes import GPT2_SIZES
from gpt2dist.errors import UsageError
from gpt2dist.launch.runner import build_spec
from gpt2dist.config.configuration import config_id
from gpt2dist.pipeline.jobs import train_command
from gpt2dist.pipeline.run import parse_run_id
from gpt2dist.pipeline.study import plan_study

from conftest import REPO, TINY_PRESET

OWN_SIZES = {"narrow": {"n_layer": 1, "n_head": 2, "n_embd": 16}, "wide": {"n_layer": 2, "n_head": 4, "n_embd": 64}}


def params_with(tmp_path, runs: list[dict], **study) -> object:
    preset = copy.deepcopy(TINY_PRESET)
    preset["study"] = {**preset["study"], "runs": runs, "model_sizes": OWN_SIZES, **study}
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump({"preset": "tiny", "container": "unused.sif", "presets": {"tiny": preset}}))
    return path


SIZED = [{"strategies": ["single"], "precisions": ["fp32"], "nproc": [1], "sizes": ["narrow", "wide"]},
         {"strategies": ["ddp"], "precisions": ["fp32"], "nproc": [2], "sizes": ["wide"]}]


@pytest.mark.parametrize("run_id, size", [("ddp-bf16-n8-medium-r3", "medium"), ("ddp-fp32-n4-xl-2nodes-r1", "xl"),
                                          ("apex-ddp-apex-O2-n2-r0", None), ("ddp-fp32-n4-2nodes-100mbit-r1", None)])
def test_a_run_id_names_its_size_and_reads_back(run_id, size):
    run = parse_run_id(run_id)
    assert run.size == size and run.run_id == run_id
    assert run.config_id == config_id(run.strategy, run.precision, run.nproc, run.nodes, run.link_mbit, size)


def test_each_size_of_a_group_is_a_configuration_of_its_own(tmp_path):
    study = plan_study(load_params(params_with(tmp_path, SIZED)), "tiny", 0)
    assert {run.config_id for run in study.runs} == {"single-fp32-n1-narrow", "single-fp32-n1-wide",
                                                     "ddp-fp32-n2-wide"}
    assert study.sizes == ["narrow", "wide"]
    wide = next(run for run in study.runs if run.config_id == "ddp-fp32-n2-wide")
    assert "--size wide" in train_command(study, wide)
    assert (study.model("wide").n_embd, study.model("narrow").n_embd) == (64, 16)
    # the control: a group without sizes trains the preset's own model under ids without a size
    plain = plan_study(load_params(params_with(tmp_path, [{k: v for k, v in SIZED[0].items() if k != "sizes"}])), "tiny", 0)
    assert plain.sizes == [None] and "--size" not in train_command(plain, plain.runs[0])


def test_train_at_a_size_trains_that_shape_and_set_still_changes_it(tmp_path, shards):
    path = params_with(tmp_path, SIZED)

    def model(*overrides: str, size: str | None = None):
        return build_spec(data=shards, out=tmp_path / "out", strategy="single", precision="fp32", nproc=1, params=load_params(path),
                          preset="tiny", overrides=list(overrides), size=size).model

    preset_model = model()
    wide = model(size="wide")
    assert (wide.n_layer, wide.n_head, wide.n_embd) == (2, 4, 64)
    assert (wide.n_positions, wide.vocab_size) == (preset_model.n_positions, preset_model.vocab_size)
    assert model("model.n_layer=3", size="wide").n_layer == 3  # a selftest's tiny depth at the size's width
    assert model(size="small").n_embd == GPT2_SIZES["small"][2]  # GPT-2's published shapes need no model_sizes


def test_the_size_travels_in_the_spec_and_the_run_record_but_is_no_part_of_its_identity(tmp_path, shards):
    path = params_with(tmp_path, SIZED)

    def spec(size: str | None, *overrides: str):
        return build_spec(data=shards, out=tmp_path / "out", strategy="single", precision="fp32", nproc=1, params=load_params(path),
                          preset="tiny", overrides=list(overrides), size=size)

    wide = spec("wide")
    assert wide.size == "wide" and wide.model_dump()["size"] == "wide"  # run.json's config is this dump
    assert spec(None).size is None
    # the same shape by --set alone computes the same thing: a checkpoint of either resumes the other
    by_hand = spec(None, *(f"model.{key}={value}" for key, value in OWN_SIZES["wide"].items()))
    assert by_hand.model == wide.model and by_hand.fingerprint() == wide.fingerprint()
    assert spec("narrow").fingerprint() != wide.fingerprint()  # the control: another shape is another run
    with pytest.raises(UsageError, match="--size '': name a model size"):
        spec("")


@pytest.mark.parametrize("change, message", [
    ({"runs": [{**SIZED[0], "sizes": ["huge"]}]},
     "unknown model size 'huge' (known: small, medium, large, xl, narrow, wide)"),
    ({"runs": [SIZED[0], {k: v for k, v in SIZED[1].items() if k != "sizes"}]},
     "some groups name model sizes and some do not"),
    ({"runs": [{**SIZED[0], "sizes": ["small"]}], "model_sizes": {"small": OWN_SIZES["wide"]}},
     "study.model_sizes names 'small', which is GPT-2's small; give that shape another name"),
    ({"runs": SIZED, "model_sizes": {"Wide-1": OWN_SIZES["wide"]}}, "'Wide-1' is no size name"),
    ({"runs": [{**SIZED[0], "sizes": ["odd"]}], "model_sizes": {"odd": {"n_layer": 1, "n_head": 3, "n_embd": 16}}},
     "model size 'odd': model: n_embd (16) must be divisible by n_head (3)"),
])
def test_a_bad_size_is_one_error_naming_the_fix(tmp_path, change, message):
    preset = copy.deepcopy(TINY_PRESET)
    preset["study"] = {**preset["study"], "model_sizes": OWN_SIZES, **change}
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump({"preset": "tiny", "container": "unused.sif", "presets": {"tiny": preset}}))
    with pytest.raises(UsageError) as refused:
        plan_study(load_params(path), "tiny", 0)
    assert message in str(refused.value) and "\n" not in str(refused.value)


def test_a_size_the_gpus_cannot_hold_is_dropped_saying_why_and_what_would_fit(tmp_path):
    """paper-sizes on 8 GPUs of 80 GB: DDP's replicated XL state and activations do not fit, the sharded
    strategies do; at 40 GB, large's DDP is dropped too. The controls: with no GPU memory stated, or planned for
    CPUs, nothing is dropped for memory."""
    study = plan_study(load_params(REPO / "params.yaml"), "paper-sizes", 8)
    assert study.sizes == ["small", "medium", "large", "xl"]
    assert set(study.dropped) == {"ddp-bf16-n8-xl"}
    assert study.dropped["ddp-bf16-n8-xl"] == ("predicted peak 73.1 GiB per GPU, 90% of a 80 GB GPU is 67.1 GiB; it "
                                               "fits with train.activation_checkpointing=block")
    assert {"fsdp-bf16-n8-xl", "zero2-bf16-n8-xl", "pp-bf16-n8-xl", "ddp-bf16-n8-large"} <= {
        run.config_id for run in study.runs}
    assert {"ddp-bf16-n8-large", "ddp-bf16-n8-xl", "fsdp-bf16-n8-xl"} <= set(
        plan_study(load_params(paper_sizes_with(tmp_path, gpu_memory_gb=40)), "paper-sizes", 8).dropped)
    assert not plan_study(load_params(paper_sizes_with(tmp_path, gpu_memory_gb=None)), "paper-sizes", 8).dropped
    assert not plan_study(load_params(REPO / "params.yaml"), "paper-sizes", 0).dropped


def paper_sizes_with(tmp_path, **study_keys) -> object:
    """A copy of the repository's params.yaml with paper-sizes' study keys changed."""
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["presets"]["paper-sizes"]["study"].update(study_keys)
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params, sort_keys=False))
    return path


def test_resolving_a_size_leaves_the_rest_of_the_preset_alone():
    _, plain = load_params(REPO / "params.yaml").preset("paper")
    _, xl = load_params(REPO / "params.yaml").preset("paper", size="xl")
    assert (xl.model.n_layer, xl.model.n_head, xl.model.n_embd) == GPT2_SIZES["xl"]
    assert xl.train == plain.train and xl.model.n_positions == plain.model.n_positions
