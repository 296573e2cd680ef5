"""The GPUs' datasheets: the most specific GPU name wins, MFU uses the peak of the arithmetic that ran, every GPU has
its memory bandwidth and sizes; the CUDA GPUs a launcher counts without importing torch."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from gpt2dist.config.schema import PRECISIONS
from gpt2dist.system.hardware import COMPUTE_DTYPE, GPUS, gpu_memory_gb, gpu_of, gpu_peaks, mfu, peak_flops

# torch.cuda.get_device_name() strings as the drivers report them, and the datasheet column each is.
DEVICE_NAMES = {
    "NVIDIA H200": ("H200", 989e12),
    "NVIDIA H200 NVL": ("H200 NVL", 835e12),
    "NVIDIA H100 80GB HBM3": ("H100", 989e12),
    "NVIDIA H100 NVL": ("H100 NVL", 835e12),
    "NVIDIA H100 PCIe": ("H100 PCIe", 756e12),
    "NVIDIA A100-SXM4-80GB": ("A100", 312e12),
    "NVIDIA A100-SXM4-40GB": ("A100-SXM4-40GB", 312e12),
    "NVIDIA A100-PCIE-40GB": ("A100-PCIE-40GB", 312e12),
    "NVIDIA A100 80GB PCIe": ("A100 80GB PCIe", 312e12),
    "NVIDIA L40S": ("L40S", 362e12),
    "NVIDIA L4": ("L4", 121e12),
    "NVIDIA A10": ("A10", 125e12),
    "NVIDIA GeForce RTX 4090": ("RTX 4090", 165.2e12),
}


@pytest.mark.parametrize("device_name", DEVICE_NAMES)
def test_most_specific_entry_wins(device_name):
    entry, bf16_peak = DEVICE_NAMES[device_name]
    assert gpu_of(device_name) is GPUS[entry]
    assert peak_flops(device_name, "bf16") == bf16_peak


def test_every_table_entry_is_reachable_by_its_own_name():
    """A fragment shadowed by a shorter one would never be chosen; list order must not matter."""
    for fragment, gpu in GPUS.items():
        assert gpu_of(f"NVIDIA {fragment}") is gpu


@pytest.mark.parametrize(("precision", "tflops"), [("fp32", 67), ("tf32", 494.5), ("bf16", 989), ("fp16", 989),
                                                   ("apex-O1", 989), ("apex-O2", 989)])
def test_peak_follows_the_arithmetic_that_ran(precision, tflops):
    assert peak_flops("NVIDIA H100 80GB HBM3", precision) == pytest.approx(tflops * 1e12)


def test_every_precision_has_a_peak_on_every_gpu_that_computes_in_it():
    assert set(COMPUTE_DTYPE) == set(PRECISIONS)
    for peaks in (gpu.peaks for gpu in GPUS.values()):
        assert {"fp32", "fp16"} <= set(peaks) <= set(COMPUTE_DTYPE.values())
        assert peaks["fp32"] <= peaks.get("tf32", peaks["fp32"]) < peaks["fp16"] == peaks.get("bf16", peaks["fp16"])
    # a GPU older than Ampere has no bf16 or tf32 arithmetic: no peak, rather than another dtype's
    assert peak_flops("Tesla V100-SXM2-16GB", "bf16") is None
    assert peak_flops("Tesla V100-SXM2-16GB", "apex-O1") == 125e12 > peak_flops("Tesla V100-PCIE-32GB", "fp16")


def test_a_name_counts_only_as_whole_words():
    """"GH200" (Grace Hopper) once matched "H200" inside it and was priced as one; a name matches where it stands
    apart from letters and digits, in any case and whatever follows ("H100-80GB")."""
    assert gpu_peaks("GH200") is None and gpu_peaks("NVIDIA GH200 480GB") is None
    assert gpu_of("H100-80GB") is GPUS["H100"] and gpu_of("h200") is GPUS["H200"]
    assert gpu_peaks("A1000") is None  # the control: a longer model number is another GPU


def test_every_gpu_has_its_memory_and_bandwidth():
    """The plan checks the fit against the memory the named GPU ships with (an H200's 141 GB, not the H100's 80), and
    the step model prices memory-bound work at its bandwidth: the 40 GB A100's HBM2 slower than the 80 GB's HBM2e,
    an H200's faster than an H100's at the same peak."""
    assert all(gpu.memory_gb == tuple(sorted(gpu.memory_gb, reverse=True)) for gpu in GPUS.values())  # largest first
    assert gpu_memory_gb("NVIDIA H200") == (141,) and gpu_memory_gb("NVIDIA A100-SXM4-40GB") == (40,)
    assert gpu_memory_gb("NVIDIA A100-SXM4-80GB") == (80, 40) and gpu_memory_gb("GH200") is None
    assert gpu_memory_gb("NVIDIA H100 NVL") == (94,)
    assert gpu_of("NVIDIA A100-SXM4-40GB").memory_bytes_per_s < gpu_of("NVIDIA A100-SXM4-80GB").memory_bytes_per_s
    assert gpu_of("H200").peaks == gpu_of("H100").peaks and gpu_of("H200").memory_bytes_per_s > gpu_of(
        "H100").memory_bytes_per_s
    assert all(0.3e12 <= gpu.memory_bytes_per_s <= 5e12 for gpu in GPUS.values())


def test_unknown_gpu_and_override():
    assert peak_flops("Tesla T4", "bf16") is None
    assert peak_flops("Tesla T4", "fp32", override_tflops=8.1) == pytest.approx(8.1e12)


def test_fp32_mfu_is_not_measured_against_the_bf16_peak():
    tokens_per_s, per_token = 10_000.0, 1e9  # 10 TFLOP/s achieved on one A100
    assert mfu(tokens_per_s, per_token, 1, peak_flops("NVIDIA A100-SXM4-80GB", "fp32")) == pytest.approx(10 / 19.5)
    assert mfu(tokens_per_s, per_token, 2, peak_flops("NVIDIA A100-SXM4-80GB", "bf16")) == pytest.approx(10 / 624)


@pytest.mark.parametrize("cuda_build", [True, False])
def test_cuda_gpus_are_the_visible_ones_only_with_a_cuda_build_of_torch(cuda_build, tmp_path):
    """The launcher's count, read without importing torch: a torch package shipping libtorch_cuda.so is a CUDA
    build; the one installed here is not, so a stand-in package (first on the path) plays each kind."""
    torch_dir = tmp_path / "torch"
    (torch_dir / "lib").mkdir(parents=True)
    (torch_dir / "__init__.py").write_text("raise ImportError('never imported')\n")
    if cuda_build:
        (torch_dir / "lib" / "libtorch_cuda.so").write_bytes(b"")
    code = "from gpt2dist.system.hardware import cuda_gpus; print(cuda_gpus())"
    shown = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={**os.environ, "PYTHONPATH": str(tmp_path), "CUDA_VISIBLE_DEVICES": "0,1"})
    assert shown.stdout.strip() == ("2" if cuda_build else "0")


def test_every_measured_share_of_a_gpu_is_a_share():
    """The best matmul's share of the 16-bit peak and the memory bandwidth's a STREAM-like kernel sustains are
    measurements below the datasheet's (system.hardware names each); the GPUs without one take the median of those
    with one (forecast.gpu_step)."""
    measured = [(name, gpu.best_matmul_share, gpu.memory_share) for name, gpu in GPUS.items()]
    assert all(0.5 < share < 1 for _, *shares in measured for share in shares if share is not None)
    assert {name for name, matmul, _ in measured if matmul} >= {"A100", "H100", "H200"}
    assert {name for name, _, memory in measured if memory} >= {"V100", "A100", "A100-SXM4-40GB", "H100", "H200"}
