"""doctor's rows say, for the chosen study, whether each piece is present, missing (the study needs it) or
not needed, in words: never None, never a bare yes or no."""

from __future__ import annotations

from gpt2dist.pipeline.study import plan_study
from gpt2dist.config.presets import load_params
from gpt2dist.system.doctor import facts

from conftest import REPO

STATUSES = {"", "present", "missing", "not needed"}


def test_gpu_pieces_are_not_needed_by_a_cpu_study_and_missing_for_a_gpu_one():
    cpu = {fact.name: fact for fact in facts(False, plan_study(load_params(REPO / "params.yaml"), "cpu", 0))}
    gpu = {fact.name: fact for fact in facts(False, plan_study(load_params(REPO / "params.yaml"), "paper", 8))}
    for name in ("CUDA (torch build)", "GPUs", "driver", "NCCL"):
        absent = (cpu[name].status, gpu[name].status) == ("not needed", "missing")
        assert absent or (cpu[name].status, gpu[name].status) == ("present", "present"), name
    # Apex: the cpu study has no Apex rows, the paper study has (present where this machine has Apex)
    assert cpu["apex.amp"].status in {"not needed", "present"} and gpu["apex.amp"].status in {"missing", "present"}
    assert cpu["apex.amp"].status != gpu["apex.amp"].status or gpu["apex.amp"].status == "present"
    for fact in [*cpu.values(), *gpu.values()]:
        assert fact.status in STATUSES and "None" not in fact.value, fact
