"""What the machine offers, without importing torch: dense BF16/FP16 tensor-core peaks (for
model FLOPs utilisation), the GPUs this process may use and which one a rank drives, and
optional command facts."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from gpt2dist.errors import UsageError

# Matched in order against torch.cuda.get_device_name(); the first substring found wins.
PEAK_BF16_FLOPS: list[tuple[str, float]] = [
    ("H200", 989e12),
    ("H100 NVL", 835e12),
    ("H100 PCIe", 756e12),
    ("H100", 989e12),  # SXM5, e.g. "NVIDIA H100 80GB HBM3"
    ("A100", 312e12),
]


def peak_flops(device_name: str, override_tflops: float | None = None) -> float | None:
    """Peak FLOP/s for a GPU name, the override when given, None when unknown."""
    if override_tflops is not None:
        return override_tflops * 1e12
    for fragment, peak in PEAK_BF16_FLOPS:
        if fragment in device_name:
            return peak
    return None


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
