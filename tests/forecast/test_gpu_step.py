"""The GPU step model (forecast/gpu_step.py): each operation at its roofline, launches and the host's dispatch, the
program's own kernels (forecast/implementations.py), a tensor-parallel split's work; and every implementation named
by the published table it is held to."""

from __future__ import annotations

import dataclasses

import pytest

from gpt2dist.config.presets import load_params
from gpt2dist.config.schema import RunSpec
from gpt2dist.config.strategies import check_placement, check_run
from gpt2dist.errors import UsageError
from gpt2dist.forecast.gpu_step import Constants, step_work
from gpt2dist.forecast.implementations import ENGINE_NAME, PUBLISHED, engine_implementation
from gpt2dist.forecast.published import read_table
from gpt2dist.system.links import links_of

from conftest import REPO

# every constant a plain unit, so that a term's seconds are the counted work itself
UNIT = Constants(gemm_efficiency=1.0, flash_efficiency=1.0, kernel_s=0.0, host_op_s=0.0)


def spec(strategy: str = "single", nproc: int = 1, precision: str = "bf16", **train) -> RunSpec:
    name, preset = load_params(REPO / "params.yaml").preset("paper")
    return RunSpec(data_dir="", out_dir="", preset=name, strategy=strategy, precision=precision, nproc=nproc,
                   device="cuda", model=preset.model, train=preset.train.model_copy(update=train))


def test_every_implementation_prices_a_published_row():
    """An implementation no row names is counted for nothing; a row naming none the model knows is left out."""
    named = set(read_table()["implementation"]) - {""}
    assert named == set(PUBLISHED) | {ENGINE_NAME}


def test_materialised_attention_is_priced_at_the_memory_bandwidth_and_flash_at_its_share_of_the_peak():
    """QK^T over a head 64 deep writes more than it multiplies: at unit efficiencies its GEMMs cost their bytes, not
    their FLOPs, on an H100; a fused kernel keeps no scores. The control: the flash implementation's micro-step has
    no such GEMM and no score bytes, so it is the cheaper by them."""
    run = spec(micro_batch_size=8, global_batch_size=8)
    eager, flash = PUBLISHED["transformers-4.12-amp"], engine_implementation(run)
    materialised = step_work(run, "H100", eager, links_of("H100")).micro
    memory_bound = [at_memory for at_peak, at_memory in zip(materialised.gemm_peak_s, materialised.gemm_memory_s)
                    if at_memory > at_peak]
    # QK^T and PV forward; backward the scores' gradient, and V's, Q's and K's (one entry of three)
    assert len(memory_bound) == 4
    fused = step_work(run, "H100", flash, links_of("H100")).micro
    assert fused.flash_peak_s > 0 == materialised.flash_peak_s
    assert len(fused.gemm_peak_s) == len(materialised.gemm_peak_s) - 4  # the same GEMMs but attention's


def test_the_host_decides_a_small_models_step_and_the_gpu_a_large_ones():
    """A step computes for the longer of the GPU's work and the host's dispatch: at a micro-batch of one sequence of
    GPT-2 small the host's 37 us per Python operator outlasts an H100's kernels, at 64 the GPU's work outlasts it.
    The control: with a native launch (llm.c's) the host dispatches nothing."""
    constants = dataclasses.replace(UNIT, host_op_s=37e-6, kernel_s=4e-6)
    one, many = (step_work(spec(micro_batch_size=rows, global_batch_size=rows), "H100",
                           engine_implementation(spec()), links_of("H100")) for rows in (1, 64))
    (gpu_one, host_one), (gpu_many, host_many) = one.micro.seconds(constants), many.micro.seconds(constants)
    assert host_one > gpu_one and gpu_many > host_many and host_one == pytest.approx(host_many)
    native = step_work(spec(), "H100", PUBLISHED["llm.c-2024-07"], links_of("H100"))
    assert native.micro.host_ops == 0 and native.step.host_ops == 0


def test_tensor_parallelism_splits_the_gemms_not_the_full_widths_work():
    """Over 4 ranks each block's GEMMs are a quarter of single's FLOPs per token, at no better a share of the peak
    (narrower GEMMs: forecast.gemm); the layer norms and residual adds on the full width stay whole on every rank
    (the memory-bound work shrinks by less than four)."""
    single, split = spec(micro_batch_size=16, global_batch_size=16), spec("tp", 4, micro_batch_size=16,
                                                                            global_batch_size=16)
    implementation = engine_implementation(single)
    alone, shared = (step_work(s, "H100", implementation, links_of("H100")).micro for s in (single, split))
    block_gemms = slice(0, 12)  # a block's forward four, backward eight
    assert sum(shared.gemm_peak_s[block_gemms]) >= sum(alone.gemm_peak_s[block_gemms]) / 4
    assert alone.memory_s / 4 < shared.memory_s < alone.memory_s


def test_fewer_micro_batches_than_stages_are_priced_with_their_bubble():
    """Megatron runs a pipeline of 4 stages on 2 micro-batches (torch's 1F1B refuses it, the control): the planner
    prices it, the bubble of 3 stages' micro-steps beside 2 micro-steps of work, a larger share than 8 micro-batches
    leave."""
    few, many = (spec("pp", 4, micro_batch_size=4, global_batch_size=rows) for rows in (8, 32))
    check_placement(few, 4)  # what any system needs of the split
    with pytest.raises(UsageError, match="needs at least one micro-batch per stage"):
        check_run(few, 4)  # this engine's pipelines
    constants = Constants(0.8, 0.15, 5e-6, 40e-6)
    terms = [step_work(s, "A100", PUBLISHED["megatron-lm-2021"], links_of("A100")).terms(constants) for s in (few, many)]
    assert terms[0].bubble_s > 0 and terms[0].bubble_s / terms[0].compute_s > 3 * terms[1].bubble_s / terms[1].compute_s


def test_the_bubble_waits_for_the_stages_without_the_head():
    """While a pipeline fills and drains, the busiest stage waits for the others' micro-steps: the first stage's
    blocks and embeddings, not the last stage's head and loss. The control: the last stage's own micro-step, which
    the bubble was priced at before, is longer."""
    run = spec("pp", 4, micro_batch_size=4, global_batch_size=32)
    work = step_work(run, "A100", PUBLISHED["megatron-lm-2021"], links_of("A100"))
    constants = Constants(0.8, 0.15, 5e-6, 0.0)
    last_stage = work.micro.seconds(constants)[0]
    assert work.terms(constants).bubble_s == pytest.approx(3 * work.filling.seconds(constants)[0])
    assert work.terms(constants).bubble_s < 3 * last_stage


def test_tensor_parallel_all_reduces_cost_what_the_hosts_dispatch_leaves():
    """A block's all-reduces run on the GPU's stream between its GEMMs: where the host's dispatch is the longer (a
    micro-batch of one sequence) they fill the GPU's idle time and the step waits for little of them; where the GPU
    is the longer (16 sequences) for all of them. The control: each priced on top of the computation, as before."""
    exposed = {}
    for rows in (1, 16):
        run = spec("tp", 4, micro_batch_size=rows, global_batch_size=rows)
        terms = step_work(run, "A100", PUBLISHED["megatron-lm-2021"], links_of("A100")).terms(
            Constants(0.8, 0.15, 5e-6, 40e-6))
        work = step_work(run, "A100", PUBLISHED["megatron-lm-2021"], links_of("A100"))
        full = next(part for part in work.communication if part.group == "tp").seconds(
            Constants(0.8, 0.15, 5e-6, 40e-6))
        exposed[rows] = terms.comm_s["tp"] / full
    assert exposed[1] < 0.5 and exposed[16] == pytest.approx(1.0)


def test_the_engines_dropout_costs_its_bytes_only_where_the_model_has_it():
    with_dropout = spec().model_copy(update={"model": spec().model.model_copy(update={"dropout": 0.1})})
    assert engine_implementation(with_dropout).width_bytes[0] > engine_implementation(spec()).width_bytes[0]
    assert engine_implementation(with_dropout).inner_bytes == engine_implementation(spec()).inner_bytes
