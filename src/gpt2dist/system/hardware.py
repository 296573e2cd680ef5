"""What the machine offers, without importing torch: each GPU's datasheet (per-dtype peak FLOP/s, for model FLOPs
utilisation against the arithmetic that actually ran and for the GPU step model; memory bandwidth and size), the
GPUs this process may use and which one a rank drives, and optional command facts."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from gpt2dist.errors import UsageError


@dataclass(frozen=True)
class GPU:
    """One datasheet column: dense peak FLOP/s per arithmetic ("fp32" the non-tensor-core FMA rate, "tf32", "bf16"
    and "fp16" the tensor-core rates without 2:4 sparsity, which NVIDIA quotes at twice these; a dtype the GPU has no
    rate for is missing), HBM (or GDDR) bandwidth, the memory sizes it ships with, in GB, the largest first, its
    streaming multiprocessors (a GEMM's tiles run in waves over them: forecast.gemm), the share of its 16-bit
    peak the best-shaped matmul was measured to reach, and the share of its memory bandwidth a STREAM-like kernel
    was measured to sustain (None where no measurement was published)."""

    peaks: dict[str, float]
    memory_bytes_per_s: float
    memory_gb: tuple[float, ...]
    sms: int
    best_matmul_share: float | None = None
    memory_share: float | None = None


_HOPPER_SXM = {"fp32": 67e12, "tf32": 494.5e12, "bf16": 989e12, "fp16": 989e12}
_HOPPER_NVL = {"fp32": 60e12, "tf32": 417.5e12, "bf16": 835e12, "fp16": 835e12}
_AMPERE_DC = {"fp32": 19.5e12, "tf32": 156e12, "bf16": 312e12, "fp16": 312e12}
# The best bf16 matmul measured, over a search of shapes, as a share of the peak (stas00/ml-engineering's "Maximum
# Achievable Matmul FLOPS" table, compute/accelerator/README.md @ 744d01e: A100 SXM 271.2 of 312 TFLOPS, A100 PCIe
# 252.9, H100 SXM 794.5 of 989, the H200 the same): the clock a board sustains under load, which its peak's boost
# clock overstates, and cuBLAS's best kernel; the other GPUs have no published measurement
_AMPERE_SXM_MATMUL, _AMPERE_PCIE_MATMUL, _HOPPER_SXM_MATMUL = 271.2 / 312, 252.9 / 312, 794.5 / 989
# The memory bandwidth a STREAM-like kernel sustains (Triad of arrays of 268 MB or more), as a share of the
# datasheet's, the median of published runs: V100 846.5 (BabelStream, kaanolgu/BabelStream docs/instructions.md
# @9714525) and 814 GB/s (te42kyfo/gpu-benches gpu-stream/v100.txt @1c36d50) of 900; A100 40 GB 1377.5 (argonne-lcf/
# ALCFBeginnersGuide polaris/02_profiling.md @ce07d3c), 1376.7 (ukri-bench/benchmark-BabelStream README @148c65c),
# 1360 (gpu-benches) and 1379.7 (xytpai/nvbench) of 1555; A100 80 GB 1724.8 (ukri-bench @464294e), 1700 (Azure/
# AI-benchmarking-guide ND_A100_v4_results.md @8fd0c6e) and 1759 (gpu-benches) of 2039; H100 SXM 2970 of 3350 and
# H200 4150 of 4800 (Azure ND H100 v5, ND H200 v5); H100 PCIe 1832 of 2000 (gpu-benches)
_VOLTA_MEMORY, _A100_40_MEMORY, _A100_80_MEMORY = 0.92, 0.885, 0.846
# Every GPU the step model prices, from NVIDIA's datasheets (https://www.nvidia.com/en-us/data-center/ and the
# GeForce and TITAN product pages; the V100, T4, A10, L4 and L40S datasheets; the Ada and Ampere GeForce
# whitepapers for the RTX cards' fp16 rate with fp32 accumulation, the rate training runs at, half their fp16-
# accumulate rate). SMs: the Hopper, Ampere, Volta and Turing architecture whitepapers and the Ada and Ampere
# GeForce ones (H100 SXM5 132, H100 PCIe 114, A100 108, V100 80, T4 40, TITAN RTX 72, RTX 3090 82, RTX 4090 128,
# A10 72, L4 58, L40S 142; the H200 and the NVL boards are the H100 SXM5's GH100 with 132). Keys are fragments of
# torch.cuda.get_device_name(); the longest fragment found wins, so "NVIDIA H200 NVL" is an H200 NVL, not an H200
# SXM, and "NVIDIA A100-SXM4-40GB" the 40 GB board with its slower HBM2.
GPUS: dict[str, GPU] = {
    "H200": GPU(_HOPPER_SXM, 4.8e12, (141,), 132, _HOPPER_SXM_MATMUL, 4150 / 4800),
    "H200 NVL": GPU(_HOPPER_NVL, 4.8e12, (141,), 132),
    "H100": GPU(_HOPPER_SXM, 3.35e12, (80,), 132, _HOPPER_SXM_MATMUL, 2970 / 3350),  # SXM5: "NVIDIA H100 80GB HBM3"
    "H100 NVL": GPU(_HOPPER_NVL, 3.9e12, (94,), 132),
    "H100 PCIe": GPU({"fp32": 51e12, "tf32": 378e12, "bf16": 756e12, "fp16": 756e12}, 2.0e12, (80,), 114,
                     memory_share=1832 / 2000),
    "A100": GPU(_AMPERE_DC, 2.039e12, (80, 40), 108, _AMPERE_SXM_MATMUL, _A100_80_MEMORY),  # SXM4 80 GB
    "A100-SXM4-40GB": GPU(_AMPERE_DC, 1.555e12, (40,), 108, _AMPERE_SXM_MATMUL, _A100_40_MEMORY),
    "A100-PCIE-40GB": GPU(_AMPERE_DC, 1.555e12, (40,), 108, _AMPERE_PCIE_MATMUL, _A100_40_MEMORY),
    "A100 80GB PCIe": GPU(_AMPERE_DC, 1.935e12, (80,), 108, _AMPERE_PCIE_MATMUL, _A100_80_MEMORY),
    "A10": GPU({"fp32": 31.2e12, "tf32": 62.5e12, "bf16": 125e12, "fp16": 125e12}, 600e9, (24,), 72),
    "L4": GPU({"fp32": 30.3e12, "tf32": 60e12, "bf16": 121e12, "fp16": 121e12}, 300e9, (24,), 58),
    "L40S": GPU({"fp32": 91.6e12, "tf32": 183e12, "bf16": 362e12, "fp16": 362e12}, 864e9, (48,), 142),
    "V100": GPU({"fp32": 15.7e12, "fp16": 125e12}, 900e9, (32, 16), 80, memory_share=_VOLTA_MEMORY),  # SXM2
    "V100-PCIE": GPU({"fp32": 14e12, "fp16": 112e12}, 900e9, (32, 16), 80, memory_share=_VOLTA_MEMORY),
    "T4": GPU({"fp32": 8.1e12, "fp16": 65e12}, 320e9, (16,), 40),
    "TITAN RTX": GPU({"fp32": 16.3e12, "fp16": 130e12}, 672e9, (24,), 72),
    "RTX 3090": GPU({"fp32": 35.6e12, "tf32": 35.6e12, "bf16": 71e12, "fp16": 71e12}, 936e9, (24,), 82),
    "RTX 4090": GPU({"fp32": 82.6e12, "tf32": 82.6e12, "bf16": 165.2e12, "fp16": 165.2e12}, 1008e9, (24,), 128),
}

# What a forecast (plan, recommend, project-scaling) assumes where it is not told: the GPU
FORECAST_GPU = "H100"

# The arithmetic each --precision runs its matmuls in, i.e. the peak its MFU is measured against.
# Apex amp casts to fp16 (O1 per op, O2 the whole model).
COMPUTE_DTYPE = {"fp32": "fp32", "tf32": "tf32", "bf16": "bf16", "fp16": "fp16", "apex-O1": "fp16", "apex-O2": "fp16"}


def named_in(device_name: str, names) -> str | None:
    """The longest of `names` that `device_name` contains as whole words, in any case ("NVIDIA H100 80GB HBM3" and
    "a100" name theirs; "GH200", a Grace Hopper board, names no H200), None when none does."""
    matches = [name for name in names
               if re.search(rf"(?<![a-z0-9]){re.escape(name.lower())}(?![a-z0-9])", device_name.lower())]
    return max(matches, key=len) if matches else None


def gpu_of(device_name: str) -> GPU | None:
    """The most specific table entry naming this GPU, None when unknown."""
    name = named_in(device_name, GPUS)
    return GPUS[name] if name else None


def gpu_peaks(device_name: str) -> dict[str, float] | None:
    """The per-dtype peaks of the GPU this names, None when unknown."""
    gpu = gpu_of(device_name)
    return gpu.peaks if gpu else None


def gpu_memory_gb(device_name: str) -> tuple[float, ...] | None:
    """The memory sizes the GPU this names ships with, None when unknown."""
    gpu = gpu_of(device_name)
    return gpu.memory_gb if gpu else None


def peak_flops(device_name: str, precision: str, override_tflops: float | None = None) -> float | None:
    """Peak FLOP/s of `precision`'s arithmetic on a GPU, the override when given, None when unknown."""
    if override_tflops is not None:
        return override_tflops * 1e12
    peaks = gpu_peaks(device_name)
    return peaks.get(COMPUTE_DTYPE[precision]) if peaks else None


def mfu(tokens_per_s: float, flops_per_token: float, n_devices: int, peak: float) -> float:
    return tokens_per_s * flops_per_token / (n_devices * peak)


def command_output(cmd: list[str], cwd: Path | None = None) -> str | None:
    """A command's stdout, or None when it is missing, fails or hangs: such facts are optional."""
    if shutil.which(cmd[0]) is None:
        return None
    try:
        out = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=20, check=True)
    except (subprocess.SubprocessError, OSError):
        return None
    return out.stdout.strip()


def visible_gpus() -> int:
    """CUDA GPUs this process may use, without importing torch (Snakemake plans with this)."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return len([d for d in listed.split(",") if d.strip() and d.strip() != "-1"])
    out = command_output(["nvidia-smi", "-L"]) or ""
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


def cuda_gpus() -> int:
    """The CUDA GPUs torch can use here, without importing torch (seconds a launcher need not spend): the visible
    GPUs, when the installed torch is a CUDA build (its CUDA library ships with it)."""
    spec = importlib.util.find_spec("torch")
    built_with_cuda = spec is not None and any(
        (Path(location) / "lib" / "libtorch_cuda.so").exists() for location in spec.submodule_search_locations or [])
    return visible_gpus() if built_with_cuda else 0


def device_index(local_rank: int, visible: int) -> int:
    """The one rule for "which GPU is mine", shared by every strategy.

    A task bound to one GPU (SLURM --gpus-per-task=1, or CUDA_VISIBLE_DEVICES set per rank)
    sees it as index 0 whatever its local rank; a process that sees the node's GPUs drives
    the one numbered like its local rank. Anything else would put two ranks on one GPU.
    """
    if visible < 1:
        raise UsageError(
            "no CUDA GPU is visible to this rank (check CUDA_VISIBLE_DEVICES and the job's GPU request); "
            "run on a GPU node or on CPU"
        )
    if visible == 1:
        return 0
    if local_rank >= visible:
        raise UsageError(
            f"local rank {local_rank} has no GPU of its own: this process sees {visible} GPUs (0-{visible - 1}); "
            f"start at most {visible} ranks per node, or give each task one GPU (srun --gpus-per-task=1)"
        )
    return local_rank
