"""TF32 is pinned per --precision at rank start, whatever the environment's default: NVIDIA's
containers export TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1, which torch reads once at import."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from gpt2dist.training.matmul_precision import pin_fp32_arithmetic

from conftest import gpt2dist, read_metrics, run_record, train_args

ampere = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 0),
                            reason="TF32 needs an Ampere or newer GPU")

PIN_AND_REPORT = """
import json, sys, torch
from gpt2dist.training.matmul_precision import pin_fp32_arithmetic
before = torch.backends.cuda.matmul.allow_tf32
print(json.dumps({"before": before, "after": pin_fp32_arithmetic(sys.argv[1], torch.device("cpu"))}))
"""


@pytest.mark.parametrize("precision, tf32", [("fp32", False), ("bf16", False), ("tf32", True)])
def test_pin_overrides_the_container_default(precision, tf32):
    env = {**os.environ, "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE": "1"}
    out = subprocess.run([sys.executable, "-c", PIN_AND_REPORT, precision], env=env, capture_output=True, text=True,
                         check=True, timeout=120)
    report = json.loads(out.stdout)
    assert report["before"] is True  # the container's default: TF32 on before anything is pinned
    after = report["after"]
    assert after["cuda_matmul_allow_tf32"] is tf32 and after["cudnn_allow_tf32"] is tf32
    assert after["float32_matmul_precision"] == ("high" if tf32 else "highest")
    assert after["environment"]["TORCH_ALLOW_TF32_CUBLAS_OVERRIDE"] == "1"


def _matmul_error(precision: str) -> float:
    """Relative error of a CUDA fp32 matmul against float64 under `precision`'s pinned settings."""
    pin_fp32_arithmetic(precision, torch.device("cuda"))
    gen = torch.Generator(device="cuda").manual_seed(0)
    a, b = (torch.randn(1024, 1024, device="cuda", generator=gen) for _ in range(2))
    exact = a.double() @ b.double()
    return ((a @ b).double() - exact).abs().max().item() / exact.abs().max().item()


@pytest.mark.gpu
@ampere
def test_tf32_changes_cuda_matmuls_and_fp32_is_ieee():
    try:
        fp32, tf32 = _matmul_error("fp32"), _matmul_error("tf32")
    finally:
        pin_fp32_arithmetic("fp32", torch.device("cuda"))
    assert fp32 < 1e-5 < tf32  # TF32 keeps 10 mantissa bits: about 1e-3 relative error


@pytest.mark.gpu
@pytest.mark.slow
@ampere
def test_tf32_run_on_gpu_records_tf32_in_effect(shards, params_file, tmp_path):
    runs = {}
    for precision in ("fp32", "tf32"):
        gpt2dist(*train_args(shards, params_file, tmp_path / precision, "single", precision=precision))
        runs[precision] = run_record(tmp_path / precision)["matmul"]
    assert runs["tf32"]["tf32_in_effect"] and not runs["fp32"]["tf32_in_effect"]
    assert read_metrics(tmp_path / "tf32")[-1]["loss"] != read_metrics(tmp_path / "fp32")[-1]["loss"]
