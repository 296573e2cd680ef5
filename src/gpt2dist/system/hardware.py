"""What the machine offers, without importing torch: per-dtype peak FLOP/s (for model FLOPs
utilisation against the arithmetic that actually ran), the GPUs this process may use and which
one a rank drives, and optional command facts."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
from pathlib import Path

from gpt2dist.errors import UsageError

# Dense peak FLOP/s per GPU and arithmetic: "fp32" is the non-tensor-core FMA rate, "tf32",
# "bf16" and "fp16" the tensor-core rates without 2:4 sparsity (NVIDIA quotes sparse figures,
# twice these). Sources: NVIDIA's H100 Tensor Core GPU datasheet (SXM, NVL and PCIe columns),
# the H200 Tensor Core GPU datasheet (SXM and NVL columns; the same GH100 compute as H100 SXM/NVL)
# and the A100 Tensor Core GPU datasheet; https://www.nvidia.com/en-us/data-center/{h100,h200,a100}/.
# Older GPUs that published measurements ran on (results/published_gpt2.csv), from their datasheets: V100 (SXM2
# and PCIe), TITAN RTX and GeForce RTX 3090 (fp16 with fp32 accumulation, as training runs; the 3090's TF32
# tensor rate equals its fp32 rate). A dtype a GPU has no rate for is missing.
# Keys are fragments of torch.cuda.get_device_name(); the longest fragment found wins, so
# "NVIDIA H200 NVL" is an H200 NVL, not an H200 SXM.
_HOPPER_SXM = {"fp32": 67e12, "tf32": 494.5e12, "bf16": 989e12, "fp16": 989e12}
_HOPPER_NVL = {"fp32": 60e12, "tf32": 417.5e12, "bf16": 835e12, "fp16": 835e12}
PEAK_FLOPS: dict[str, dict[str, float]] = {
    "H200": _HOPPER_SXM,
    "H200 NVL": _HOPPER_NVL,
    "H100": _HOPPER_SXM,  # SXM5, e.g. "NVIDIA H100 80GB HBM3"
    "H100 NVL": _HOPPER_NVL,
    "H100 PCIe": {"fp32": 51e12, "tf32": 378e12, "bf16": 756e12, "fp16": 756e12},
    "A100": {"fp32": 19.5e12, "tf32": 156e12, "bf16": 312e12, "fp16": 312e12},
    "V100": {"fp32": 15.7e12, "fp16": 125e12},  # SXM2
    "V100-PCIE": {"fp32": 14e12, "fp16": 112e12},
    "TITAN RTX": {"fp32": 16.3e12, "fp16": 130e12},
    "RTX 3090": {"fp32": 35.6e12, "tf32": 35.6e12, "bf16": 71e12, "fp16": 71e12},
}

# What a forecast (plan, recommend, project-scaling) assumes where it is not told: the GPU, and the share of its peak
# the computation reaches (llm.c trains GPT-2 on 8 H100s at about 0.4)
FORECAST_GPU, FORECAST_MFU = "H100", 0.4

# The memory each of those GPUs ships with, in GB as its datasheet states it, the largest first (A100 and V100 were
# sold with two): what a plan checks a run's predicted peak against unless told other sizes.
GPU_MEMORY_GB: dict[str, tuple[float, ...]] = {
    "H200": (141,), "H200 NVL": (141,), "H100": (80,), "H100 NVL": (94,), "H100 PCIe": (80,), "A100": (80, 40),
    "V100": (32, 16), "V100-PCIE": (32, 16), "TITAN RTX": (24,), "RTX 3090": (24,),
}

# The arithmetic each --precision runs its matmuls in, i.e. the peak its MFU is measured against.
# Apex amp casts to fp16 (O1 per op, O2 the whole model).
COMPUTE_DTYPE = {"fp32": "fp32", "tf32": "tf32", "bf16": "bf16", "fp16": "fp16", "apex-O1": "fp16", "apex-O2": "fp16"}


def named_in(device_name: str, names) -> str | None:
    """The longest of `names` that `device_name` contains as whole words, in any case ("NVIDIA H100 80GB HBM3" and
    "a100" name theirs; "GH200", a Grace Hopper board, names no H200), None when none does."""
    matches = [name for name in names
               if re.search(rf"(?<![a-z0-9]){re.escape(name.lower())}(?![a-z0-9])", device_name.lower())]
    return max(matches, key=len) if matches else None


def gpu_peaks(device_name: str) -> dict[str, float] | None:
    """The per-dtype peaks of the most specific table entry naming this GPU, None when unknown."""
    name = named_in(device_name, PEAK_FLOPS)
    return PEAK_FLOPS[name] if name else None


def gpu_memory_gb(device_name: str) -> tuple[float, ...] | None:
    """The memory sizes the GPU this names ships with, None when unknown."""
    name = named_in(device_name, GPU_MEMORY_GB)
    return GPU_MEMORY_GB[name] if name else None


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
