"""What a result depends on besides the config: versions, devices, interconnect, commit."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import shutil
import subprocess
from pathlib import Path

import torch


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _run(cmd: list[str], cwd: Path | None = None) -> str | None:
    if shutil.which(cmd[0]) is None:
        return None
    try:
        out = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=20, check=True)
    except (subprocess.SubprocessError, OSError):
        return None
    return out.stdout.strip()


def git_commit(repo: Path | None = None) -> dict:
    repo = repo or Path.cwd()
    commit = _run(["git", "rev-parse", "HEAD"], cwd=repo)
    dirty = _run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=repo)
    return {"commit": commit, "dirty": bool(dirty) if commit else None}


def versions() -> dict:
    nccl = None
    if torch.cuda.is_available():
        nccl = ".".join(map(str, torch.cuda.nccl.version()))
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": _version("transformers"),
        "horovod": _version("horovod"),
        "apex": _version("apex"),
        "cuda": torch.version.cuda,
        "nccl": nccl,
    }


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def devices() -> dict:
    info = {
        "cpu": _cpu_model(),
        "cpu_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "hostname": platform.node(),
        "gpus": [],
    }
    if torch.cuda.is_available():
        info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        info["driver"] = _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
        info["topology"] = _run(["nvidia-smi", "topo", "-m"])
    return info


def capture() -> dict:
    return {"versions": versions(), "devices": devices(), "git": git_commit()}
