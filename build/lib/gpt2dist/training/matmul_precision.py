"""Pin how fp32 matmuls and convolutions run, for every --precision, at rank start.

NVIDIA's PyTorch containers start torch with TF32 on (TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1);
stock torch starts with it off for cuBLAS and on for cuDNN. Setting both flags explicitly
makes `fp32` IEEE fp32 inside and outside the image, and `tf32` the image's default, run
as its own control. Mixed precisions pin IEEE too, so their remaining fp32 matmuls match
the fp32 runs.
"""

from __future__ import annotations

import os

import torch

TF32_ENV = ("TORCH_ALLOW_TF32_CUBLAS_OVERRIDE", "NVIDIA_TF32_OVERRIDE")


def pin_fp32_arithmetic(precision: str, device: torch.device) -> dict:
    """Set TF32 on for `tf32` and off otherwise; return the settings in force, for run.json."""
    tf32 = precision == "tf32"
    # The allow_tf32 flags, not torch 2.9's fp32_precision API: torch 2.8 lacks it, and setting
    # it alone under TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1 leaves the legacy state at TF32, which
    # torch 2.13 rejects as a mix of APIs when cuBLAS asks. These setters keep both in step.
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    settings = {
        "cuda_matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32,
        "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "environment": {name: os.environ.get(name) for name in TF32_ENV},
    }
    if device.type != "cuda":
        settings["note"] = "CPU has no TF32 arithmetic: these CUDA flags do nothing here and tf32 runs as IEEE fp32"
    elif tf32 and torch.cuda.get_device_capability(device) < (8, 0):
        settings["note"] = "TF32 needs compute capability 8.0 (Ampere) or newer: this tf32 run is IEEE fp32"
    elif tf32 and os.environ.get("NVIDIA_TF32_OVERRIDE") == "0":
        settings["note"] = "NVIDIA_TF32_OVERRIDE=0 turns TF32 off inside NVIDIA's libraries: this tf32 run is IEEE fp32"
    settings["tf32_in_effect"] = tf32 and device.type == "cuda" and "note" not in settings
    return settings
