"""The GPU step model (forecast/gpu_step.py): each operation at its roofline, launches and the host's dispatch, the
program's own kernels (forecast/implementations.py), a tensor-parallel split's work; and every implementation named
by the published table it is held to."""

from __future__ import annotations

import dataclasses

import pytest

from gpt2dist.config.presets import load_params
from gpt2dist.config.schema import RunSpec
from gpt2dist.forecast.gpu_step import Constants, step_work
from gpt2dist.forecast.implementations import ENGINE_NAME, PUBLISHED, engine_implementation
from gpt2dist.forecast.published import read_table
from gpt2dist.system.links import links_of

from conftest import REPO

# every constant a plain unit, so that a term's seconds are the counted work itself
UNIT = Constants(gemm_efficiency=1.0, memory_efficiency=1.0, flash_efficiency=1.0, link_efficiency=1.0,
                 kernel_s=0.0, host_op_s=0.0)


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
    """Over 4 ranks each block's GEMMs are a quarter of single's FLOPs per token; the layer norms and residual adds
    on the full width stay whole on every rank (the memory-bound work shrinks by less than four)."""
    single, split = spec(micro_batch_size=16, global_batch_size=16), spec("tp", 4, micro_batch_size=16,
                                                                            global_batch_size=16)
    implementation = engine_implementation(single)
    alone, shared = (step_work(s, "H100", implementation, links_of("H100")).micro for s in (single, split))
    block_gemms = slice(0, 12)  # a block's forward four, backward eight
    assert sum(shared.gemm_peak_s[block_gemms]) == pytest.approx(sum(alone.gemm_peak_s[block_gemms]) / 4)
    assert alone.memory_s / 4 < shared.memory_s < alone.memory_s


def test_the_engines_dropout_costs_its_bytes_only_where_the_model_has_it():
    with_dropout = spec().model_copy(update={"model": spec().model.model_copy(update={"dropout": 0.1})})
    assert engine_implementation(with_dropout).width_bytes[0] > engine_implementation(spec()).width_bytes[0]
    assert engine_implementation(with_dropout).inner_bytes == engine_implementation(spec()).inner_bytes
