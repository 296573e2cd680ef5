"""`gpt2dist doctor`: what this environment can run, and which pieces the chosen preset's
study needs but does not find. The same facts are embedded in every run.json."""

from __future__ import annotations

import os
from dataclasses import dataclass

from gpt2dist.config.machine import describe_cpu
from gpt2dist.config.strategies import extras_needed
from gpt2dist.errors import UsageError
from gpt2dist.pipeline.study import Study
from gpt2dist.system import environment
from gpt2dist.system.allocation import job_allocation


@dataclass(frozen=True)
class Fact:
    """One row: what was found, and `status`: 'present', 'missing' (the study needs it), 'not needed' (absent,
    and the study does not need it), or '' for a plain fact (a version, the CPU)."""
    name: str
    value: str
    status: str = ""


class Found:
    """What this environment has of the optional pieces runs need, looked up once (importing Horovod takes seconds)."""

    def __init__(self):
        self.horovod, apex = environment.horovod_build(), environment.apex_features()
        self.modules = {"horovod.torch": self.horovod is not None, "apex.amp": apex["amp"],
                        "apex.parallel": apex["parallel"]}
        self.cuda_build = environment.versions()["cuda"] is not None
        self.torch = environment.versions()["torch"]

    def missing(self, strategy: str, precision: str, device: str, no_gpu: bool = False,
                torch_build: bool = True) -> list[tuple[str, str]]:
        """(What, how to get it) for each piece a run of `strategy` in `precision` on `device` needs and this
        environment lacks (its torch's build too, unless `torch_build` is False: a plan made off the nodes)."""
        gaps = []
        # even with --no-gpu (an image built on a host without GPUs): a CPU-only torch never runs a GPU study
        if torch_build and device == "cuda" and not self.cuda_build:
            gaps.append(("a CUDA build of torch", f"torch {self.torch} is CPU-only"))
        extras = extras_needed(strategy, precision)
        gaps += [(extra.name, extra.source) for extra in extras if not self.modules[extra.module]]
        if (device == "cuda" and not no_gpu and self.horovod is not None and not self.horovod["nccl"]
                and any(e.module == "horovod.torch" for e in extras)):
            gaps.append(("Horovod built with NCCL", "rebuild it with containers/install_horovod.sh --gpu"))
        return gaps


def _piece(name: str, value: str, found: bool, needed: bool) -> Fact:
    return Fact(name, value, "present" if found else "missing" if needed else "not needed")


def facts(no_gpu: bool, study: Study) -> list[Fact]:
    versions, devices = environment.versions(), environment.devices()
    hvd, apex = environment.horovod_build(), environment.apex_features()
    mpi = environment.mpi_implementation()
    modules = {extra.module for run in study.runs for extra in extras_needed(run.strategy, run.precision)}
    gpu_study = study.device == "cuda"
    rows = [
        Fact("python", versions["python"]),
        Fact("torch", versions["torch"]),
        Fact("image", _image_summary(environment.image())),
        Fact("CPU", f"{describe_cpu(devices['cpu'], devices['cpu_identity'])}, {devices['cpu_cores']} cores"),
        Fact("bf16 on the CPU", {"native": "native (AVX512-BF16 or AMX)",
                                 "emulated": "emulated (no AVX512-BF16 or AMX): preset auto picks cpu-emulated-bf16",
                                 "unknown": "unknown"}[devices["cpu_bf16"]]),
        # horovodrun starts ranks with its Gloo controller (launch/commands.py): MPI is a fact, not a need
        _piece("MPI", mpi or "not found", mpi is not None, needed=False),
        _piece("Horovod", "not importable" if hvd is None else
               f"{versions['horovod']} (gloo {hvd['gloo']}, mpi {hvd['mpi']}, nccl {hvd['nccl']})",
               hvd is not None and (hvd["nccl"] or not gpu_study or no_gpu), "horovod.torch" in modules),
        _piece("apex.amp", "importable" if apex["amp"] else "not importable", apex["amp"], "apex.amp" in modules),
        _piece("apex.parallel", "importable" if apex["parallel"] else "not importable", apex["parallel"],
               "apex.parallel" in modules),
        _piece("apex fused optimizers", "importable" if apex["fused_adam"] and apex["amp_C"] else "not importable",
               apex["fused_adam"] and apex["amp_C"], "apex.amp" in modules),
    ]
    if not no_gpu:
        gpus = devices["gpus"]
        rows += [
            _piece("CUDA (torch build)", versions["cuda"] or "none: a CPU-only build of torch",
                   versions["cuda"] is not None, gpu_study),
            _piece("GPUs", ", ".join(gpus) or "none visible", bool(gpus), gpu_study),
            _piece("driver", devices.get("driver") or "not found (no nvidia-smi)", devices.get("driver") is not None,
                   gpu_study),
            _piece("NCCL", versions["nccl"] or "not read (no GPU visible)", versions["nccl"] is not None, gpu_study),
            Fact("interconnect (nvidia-smi topo -m)", devices.get("topology") or "unknown"),
        ]
    for key, value in environment.slurm().items():
        rows.append(Fact(key, value))
    if "SLURM_JOB_ID" in os.environ:
        rows.append(_allocation())
    return rows


def _image_summary(record: dict | None) -> str:
    if record is None:
        return "none (not inside a gpt2dist image)"
    if "error" in record:
        return record["error"]
    base = record.get("base", {})
    return (f"gpt2dist {record.get('variant')} image {str(record.get('content_id'))[:19]} "
            f"on {base.get('name')} ({str(base.get('id'))[:19]})")


def _allocation() -> Fact:
    """The job's allocation as `gpt2dist train` will read it, to launch its ranks."""
    try:
        allocation = job_allocation()
    except UsageError as exc:
        return Fact("SLURM allocation", str(exc), "missing")
    if allocation is None:
        return Fact("SLURM allocation", "inside a job step: ranks start on this node")
    gpus = f", {allocation.gpus_per_node} GPUs per node" if allocation.gpus_per_node else ""
    return Fact("SLURM allocation", f"{len(allocation.nodes)} node(s) {','.join(allocation.nodes)}, "
                f"{allocation.tasks} tasks x {allocation.cpus_per_task} CPUs{gpus}")


def missing_for(study: Study, no_gpu: bool) -> list[str]:
    """Each piece the study's runs need that this environment lacks: which runs need it, and the fix."""
    needs: dict[tuple[str, str], list[str]] = {}  # (what, how to get it) -> configurations
    found = Found()
    for run in study.runs:
        if run.repeat:
            continue
        for piece in found.missing(run.strategy, run.precision, study.device, no_gpu):
            needs.setdefault(piece, []).append(run.config_id)
    configurations = sum(1 for run in study.runs if not run.repeat)
    return [f"{what}, needed by "
            + (f"all {len(runs)} configurations" if len(runs) == configurations else ", ".join(runs))
            + f": {fix}" for (what, fix), runs in needs.items()]
