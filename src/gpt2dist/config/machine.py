"""What the planning machine's CPU can do, read without torch: `preset: auto` chooses the cpu study's
variant from it, and run.json records it."""

from __future__ import annotations

from pathlib import Path

BF16_FLAGS = {"avx512_bf16", "amx_bf16"}  # /proc/cpuinfo flags of the x86 instructions that compute in bf16


def _first_processor(cpuinfo: str | None) -> dict[str, str] | None:
    """The first processor's fields of /proc/cpuinfo (None where it cannot be read)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return None
    fields = {}
    for line in cpuinfo.splitlines():
        if not line.strip():
            if fields:
                break
            continue
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    return fields


def cpu_bf16(cpuinfo: str | None = None) -> str:
    """'native' when the CPU has bf16 instructions (AVX512-BF16 or AMX), 'emulated' when it has not (AVX2
    only: torch then emulates bf16 matrix products, several times slower than fp32), 'unknown' where
    /proc/cpuinfo has no flags (not Linux, not x86)."""
    fields = _first_processor(cpuinfo)
    if not fields or "flags" not in fields:
        return "unknown"
    flags = fields["flags"].split()
    return "native" if BF16_FLAGS & set(flags) else "emulated"


# the flags that change how fast the study's arithmetic runs, in the words a reader knows them by
SPEED_FLAGS = {"avx2": "AVX2", "avx512f": "AVX-512", "avx512_bf16": "AVX512-BF16", "amx_bf16": "AMX-BF16"}


def cpu_identity(cpuinfo: str | None = None) -> dict:
    """What tells two CPUs apart when their model names do not (a virtual machine's "AMD EPYC"): family,
    model and stepping numbers, the instruction sets that change the study's speed, the clock (MHz, as read
    now). Empty where /proc/cpuinfo cannot be read."""
    fields = _first_processor(cpuinfo) or {}
    flags = set(fields.get("flags", "").split())
    identity = {key: fields[name] for key, name in (("family", "cpu family"), ("model", "model"),
                                                      ("stepping", "stepping")) if name in fields}
    if "cpu MHz" in fields:
        identity["mhz"] = round(float(fields["cpu MHz"]))
    if flags:
        identity["speed_flags"] = [word for flag, word in SPEED_FLAGS.items() if flag in flags]
    return identity


def describe_cpu(name: str, identity: dict) -> str:
    """'AMD EPYC (family 25 model 1, AVX2 only)': a CPU's name with what tells it apart (just the name where
    the identity was not recorded)."""
    if "family" not in identity:
        return name
    flags = identity.get("speed_flags") or []
    sets = " + ".join(flags) if set(flags) - {"AVX2"} else f"{' + '.join(flags) or 'no AVX2'} only"
    return f"{name} (family {identity['family']} model {identity['model']}, {sets})"
