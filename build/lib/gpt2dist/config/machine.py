"""What the planning machine's CPU can do, read without torch: `preset: auto` chooses the cpu study's
variant from it, and run.json records it."""

from __future__ import annotations

from pathlib import Path

BF16_FLAGS = {"avx512_bf16", "amx_bf16"}  # /proc/cpuinfo flags of the x86 instructions that compute in bf16


def cpu_bf16(cpuinfo: str | None = None) -> str:
    """'native' when the CPU has bf16 instructions (AVX512-BF16 or AMX), 'emulated' when it has not (AVX2
    only: torch then emulates bf16 matrix products, several times slower than fp32), 'unknown' where
    /proc/cpuinfo has no flags (not Linux, not x86)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return "unknown"
    flags = next((line.split(":", 1)[1].split() for line in cpuinfo.splitlines() if line.startswith("flags")), None)
    if flags is None:
        return "unknown"
    return "native" if BF16_FLAGS & set(flags) else "emulated"
