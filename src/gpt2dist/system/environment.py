"""What a result depends on besides the config: versions, devices, interconnect, commit."""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
from pathlib import Path

import torch

from gpt2dist.config.machine import cpu_bf16, cpu_identity
from gpt2dist.system.hardware import command_output

# Written by containers/build_image.sh into every image it builds: the base and the image's ID.
IMAGE_RECORD = Path("/opt/gpt2dist/image.json")


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def git_commit(repo: Path | None = None) -> dict:
    repo = repo or Path.cwd()
    commit = command_output(["git", "rev-parse", "HEAD"], cwd=repo)
    dirty = command_output(["git", "status", "--porcelain", "--untracked-files=no"], cwd=repo)
    return {"commit": commit, "dirty": bool(dirty) if commit else None}


def versions() -> dict:
    nccl = None
    if torch.cuda.is_available():
        nccl = ".".join(map(str, torch.cuda.nccl.version()))
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "horovod": _version("horovod"),
        "apex": _version("apex"),
        "cuda": torch.version.cuda,
        "nccl": nccl,
    }


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def devices() -> dict:
    info = {
        "cpu": cpu_model(),
        "cpu_bf16": cpu_bf16(),
        "cpu_identity": cpu_identity(),
        "cpu_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "hostname": platform.node(),
        "gpus": [],
    }
    if torch.cuda.is_available():
        info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        info["driver"] = command_output(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
        info["gpu_memory_gib"] = [round(torch.cuda.get_device_properties(i).total_memory / 2**30)
                                  for i in range(torch.cuda.device_count())]
        info["power_limit_w"] = power_limit_w()
        info["topology"] = command_output(["nvidia-smi", "topo", "-m"])
    return info


def power_limit_w() -> float | None:
    """GPU 0's power limit in watts (a capped GPU is a slower machine of the same name); None where unknown."""
    out = command_output(["nvidia-smi", "--query-gpu=power.limit", "--format=csv,noheader,nounits"])
    try:
        return float(out.splitlines()[0])
    except (AttributeError, IndexError, ValueError):  # no nvidia-smi, or "[N/A]"
        return None


def threads() -> dict:
    """How many threads this process computes with and which CPUs it may use: a run given two
    threads on one CPU measures the scheduler, not the strategy."""
    return {"torch": torch.get_num_threads(), "interop": torch.get_num_interop_threads(),
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
            "cpu_affinity": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None}


def mpi_implementation() -> str | None:
    """First line of `mpirun --version` (Open MPI, MPICH, ...), None without MPI."""
    out = command_output(["mpirun", "--version"])
    return out.splitlines()[0] if out else None


def horovod_build() -> dict | None:
    """Which controllers and GPU operations Horovod was built with; None when not importable."""
    try:
        import horovod.torch as hvd
    except ImportError:
        return None
    return {"gloo": bool(hvd.gloo_built()), "mpi": bool(hvd.mpi_built()), "nccl": bool(hvd.nccl_built())}


def apex_features() -> dict:
    """apex.amp (removed from Apex after 25.05), its DDP wrapper and the CUDA-extension fused optimizers."""
    features = {}
    for name, module in (("amp", "apex.amp"), ("parallel", "apex.parallel"), ("fused_adam", "apex.optimizers"),
                         ("amp_C", "amp_C")):
        try:
            __import__(module)
            features[name] = True
        except Exception:  # a broken extension raises more than ImportError
            features[name] = False
    return features


def slurm() -> dict:
    keys = ("SLURM_JOB_ID", "SLURM_JOB_NODELIST", "SLURM_NNODES", "SLURM_NTASKS", "SLURM_STEP_ID",
            "SLURM_CPUS_PER_TASK", "SLURM_GPUS_ON_NODE")
    return {key: os.environ[key] for key in keys if key in os.environ}


def distributed() -> dict:
    return {"mpi": mpi_implementation(), "horovod": horovod_build(), "apex": apex_features(), "slurm": slurm()}


def image(record: Path = IMAGE_RECORD) -> dict | None:
    """The gpt2dist image this runs in (its build record), None outside one. A record that cannot
    be read is reported as such rather than dropped: the run did happen inside some image."""
    if not record.exists():
        return None
    try:
        return json.loads(record.read_text())
    except (OSError, ValueError) as exc:
        return {"error": f"{record} unreadable: {exc}"}


def capture() -> dict:
    return {"versions": versions(), "devices": devices(), "distributed": distributed(), "git": git_commit(),
            "image": image()}
