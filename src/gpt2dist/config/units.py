"""Bytes: per element in each precision, and what one rank sends in a ring collective. The memory and traffic
models and the GPU step model all count in these."""

from __future__ import annotations

FP32, HALF = 4, 2  # bytes per element
APEX_PRECISIONS = ("apex-O1", "apex-O2")


def gradient_bytes(precision: str) -> int:
    """Bytes per gradient element: O2's model, and so its gradients, are fp16; every other precision keeps fp32."""
    return HALF if precision == "apex-O2" else FP32


def compute_bytes(precision: str) -> int:
    """Bytes per activation element in the precision's compute dtype (16-bit under autocast and Apex amp)."""
    return HALF if precision in ("bf16", "fp16", *APEX_PRECISIONS) else FP32


def ring_all_reduce(size: float, n: int) -> float:
    """Bytes one rank sends in a ring all-reduce of `size` bytes over n ranks."""
    return 2 * (n - 1) / n * size


def ring_gather(size: float, n: int) -> float:
    """Bytes one rank sends in a ring all-gather or reduce-scatter of a full tensor of `size` bytes."""
    return (n - 1) / n * size
