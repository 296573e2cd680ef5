"""The GPU matrix (test_gpu_matrix.py) skips the combinations the study refuses. A check_run that wrongly refused
a valid one would hide there as a skip, so its refusals are compared here, on CPU, with the rules that test
states apart from it, for nodes of 1, 2 and 8 GPUs; and a wrong refusal is shown to fail, not skip."""

from __future__ import annotations

import pytest
import test_gpu_matrix
from test_gpu_matrix import refusal

from gpt2dist.config.schema import PRECISIONS, STRATEGY_NAMES
from gpt2dist.errors import UsageError


@pytest.mark.parametrize("gpus", [1, 2, 8])
def test_check_run_refuses_on_gpus_exactly_what_the_rules_refuse(gpus):
    refused = {(s, p, n) for s in STRATEGY_NAMES for p in PRECISIONS for n in sorted({1, gpus})
               if (reason := refusal(s, p, n, gpus)) and not reason.startswith("needs NVIDIA Apex")}
    assert ("fsdp", "apex-O1", 1) in refused and ("ddp", "bf16", 1) not in refused
    assert (("single", "fp32", gpus) in refused) is (gpus > 1)


def test_a_wrong_refusal_fails_instead_of_skipping(monkeypatch):
    """The control: a check_run that refuses ddp in fp32, which is valid, fails the matrix's test."""
    def refuses_ddp(spec, gpus):
        if spec.strategy == "ddp":
            raise UsageError("ddp is not allowed")

    monkeypatch.setattr(test_gpu_matrix, "check_run", refuses_ddp)
    with pytest.raises(pytest.fail.Exception, match="check_run refuses ddp fp32 on 1 of 1 GPUs, which is valid"):
        refusal("ddp", "fp32", 1, 1)
    with pytest.raises(pytest.fail.Exception, match="lets fsdp apex-O1 on 1 of 1 GPUs through"):
        refusal("fsdp", "apex-O1", 1, 1)
