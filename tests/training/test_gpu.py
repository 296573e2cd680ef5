"""GPU-only paths (NCCL, DataParallel over devices, fp16 GradScaler, Apex). Skipped without CUDA."""

import importlib.util

import pytest
import torch

from conftest import gpt2dist, gpu, read_metrics, run_record, train_args

pytestmark = [pytest.mark.gpu, gpu]


@pytest.mark.parametrize("strategy, precision", [("single", "fp32"), ("ddp", "fp16"), ("ddp", "bf16"),
                                                 ("dp", "fp32"), ("fsdp", "bf16"), ("horovod", "fp16")])
def test_one_gpu(strategy, precision, shards, params_file, tmp_path):
    gpt2dist(*train_args(shards, params_file, tmp_path, strategy, precision=precision))
    record = run_record(tmp_path)
    assert record["status"] == "completed" and record["devices"]["gpus"]
    assert record["placement"]["device"].startswith("cuda")
    losses = [line["loss"] for line in read_metrics(tmp_path)]
    assert losses[-1] < losses[0]
    assert read_metrics(tmp_path)[-1]["peak_mem_bytes"] < torch.cuda.get_device_properties(0).total_memory


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
@pytest.mark.parametrize("strategy", ["dp", "ddp", "horovod"])
def test_two_gpus(strategy, shards, params_file, tmp_path):
    gpt2dist(*train_args(shards, params_file, tmp_path, strategy, nproc=2))
    assert run_record(tmp_path)["status"] == "completed"


@pytest.mark.skipif(importlib.util.find_spec("apex") is None, reason="needs NVIDIA Apex (the container image)")
@pytest.mark.parametrize("strategy", ["ddp", "horovod"])
def test_apex_o1(strategy, shards, params_file, tmp_path):
    gpt2dist(*train_args(shards, params_file, tmp_path, strategy, precision="apex-O1"))
    assert run_record(tmp_path)["status"] == "completed"
