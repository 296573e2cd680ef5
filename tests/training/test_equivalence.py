"""The core claim: with the same global batch, every distributed strategy follows the
single-process loss curve (fp32). Compared per step: the global-batch loss, the global
gradient norm (which exposes gradients summed instead of averaged: AdamW and clipping
would hide a scale error in the loss), and the final parameters."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
import torch.distributed as dist

from gpt2dist.config.presets import load_params
from gpt2dist.config.schema import RunSpec
from gpt2dist.launch.runner import build_spec
from gpt2dist.training.batches import BatchSampler
from gpt2dist.training.loop import Trainer
from gpt2dist.launch.commands import horovodrun_bin
from gpt2dist.training.strategies.ddp import DDP
from gpt2dist.training.strategies.torch_distributed import TorchDistributed

from conftest import (REPO, as_torchrun_rank, assert_same_losses, final_params, free_port, gpt2dist, read_metrics,
                      run_record, start_ranks, train_args)

RTOL = 1e-5  # per-step loss and grad norm, relative
ATOL_PARAMS = 1e-5  # final parameters, absolute
# A strategy in a reduced precision may stray from single in that precision by MARGIN times what the
# precision itself does (single in it against single in fp32), a tolerance measured in each session
MARGIN = 3

# Every strategy's 2-rank run against single's is the fast tier (`pytest -m "not slow"`); the fault-injected
# controls, which train more runs, are slow.


def _relative_gap(reference: float, value: float) -> float:
    """|value - reference| / |reference|; a step that overflowed in both (fp16's skipped step) agrees."""
    if not (math.isfinite(reference) and math.isfinite(value)):
        return 0.0 if reference == value else math.inf
    return abs(value - reference) / abs(reference)


def divergence(reference, run) -> dict[str, float]:
    ref_lines, run_lines = read_metrics(reference), read_metrics(run)
    assert [line["step"] for line in run_lines] == [line["step"] for line in ref_lines]
    ref_params, run_params = final_params(reference), final_params(run)
    assert ref_params.keys() == run_params.keys()
    return {
        "loss": max(_relative_gap(a["loss"], b["loss"]) for a, b in zip(ref_lines, run_lines)),
        "grad_norm": max(_relative_gap(a["grad_norm"], b["grad_norm"]) for a, b in zip(ref_lines, run_lines)),
        "params": max((ref_params[k] - run_params[k]).abs().max().item() for k in ref_params),
    }


def share(run_dir, prefixes: tuple[str, ...] = (), suffixes: tuple[str, ...] = ()) -> float:
    """The share of a model's parameters whose names start or end so."""
    params = {n: t for n, t in final_params(run_dir).items() if n != "lm_head.weight"}  # tied to the embedding
    chosen = [t for n, t in params.items() if (prefixes and n.startswith(prefixes)) or (suffixes and n.endswith(suffixes))]
    return sum(t.numel() for t in chosen) / sum(t.numel() for t in params.values())


def split_share(run_dir) -> float:
    """The share of a model's parameters that tensor parallelism splits over its ranks."""
    return share(run_dir, suffixes=("attn.c_attn.weight", "attn.c_attn.bias", "c_fc.weight", "c_fc.bias", "c_proj.weight"))


def assert_follows_reference(reference, run, rtol: float = RTOL, atol_params: float = ATOL_PARAMS) -> None:
    d = divergence(reference, run)
    assert d["loss"] <= rtol and d["grad_norm"] <= rtol and d["params"] <= atol_params, d


def assert_follows_in_precision(single_fp32, single_reduced, run) -> None:
    """A reduced-precision run against single in the same precision, within MARGIN times what that precision
    alone does to single's loss, gradient norm and final weights: rounding moves a correct strategy a little,
    summed gradients (step 0's norm doubled) or another sample's rows move it far more."""
    own = divergence(single_fp32, single_reduced)
    assert own["loss"] > 1e-6, own  # the precision changed the arithmetic, or there is no tolerance to derive
    d = divergence(single_reduced, run)
    assert all(d[k] <= MARGIN * own[k] for k in d), {"run vs single": d, "the precision alone": own}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("strategy", ["ddp", "fsdp", "horovod", "tp", "pp"])
def test_two_ranks_follow_single_process(strategy, reference, trained):
    run = trained(strategy, nproc=2)
    assert_follows_reference(reference, run)
    # the loss must actually move, or agreeing curves would prove nothing
    losses = [line["loss"] for line in read_metrics(run)]
    assert losses[-1] < 0.9 * losses[0]
    record, single = run_record(run), run_record(reference)
    assert record["placement"]["backend"] == {"horovod": "horovod gloo"}.get(strategy, "gloo")
    # model state counted from the tensors: FSDP's rank 0 holds half of it, the replicating strategies all of
    # it, tp half of what it splits (every block matrix and the column-parallel biases), pp's first stage
    # the embeddings and block 0
    held = record["model_state_bytes"]["total"] / single["model_state_bytes"]["total"]
    expected = {"fsdp": 0.5, "tp": 1 - split_share(reference) / 2,
                "pp": share(reference, ("transformer.wte.", "transformer.wpe.", "transformer.h.0."))}
    assert held == pytest.approx(expected.get(strategy, 1.0), rel=0.02)


@pytest.mark.timeout(300)
def test_dp_on_cpu_is_the_degenerate_one_device_case(reference, trained):
    assert_follows_reference(reference, trained("dp"))
    record = run_record(trained("dp"))
    assert record["strategy"] == "dp" and record["placement"]["degenerate"] is True


def test_tf32_on_cpu_is_fp32_and_says_so(reference, shards, params_file, tmp_path):
    """CPU has no TF32 arithmetic: the tf32 control must train exactly like fp32 there, and run.json must say why."""
    gpt2dist(*train_args(shards, params_file, tmp_path, "single", precision="tf32"))
    assert divergence(reference, tmp_path) == {"loss": 0.0, "grad_norm": 0.0, "params": 0.0}
    tf32, fp32 = run_record(tmp_path)["matmul"], run_record(reference)["matmul"]
    assert tf32["cuda_matmul_allow_tf32"] and tf32["cudnn_allow_tf32"] and not tf32["tf32_in_effect"]
    assert "tf32 runs as IEEE fp32" in tf32["note"]
    assert not fp32["cuda_matmul_allow_tf32"] and not fp32["cudnn_allow_tf32"]
    assert fp32["float32_matmul_precision"] == "highest"


# --- negative controls: the comparison must catch the two classic data-parallel bugs ----

def _sum_hook(state, bucket):
    """All-reduce SUM without dividing by world size: the 'summed, not averaged' bug."""
    return dist.all_reduce(bucket.buffer(), async_op=True).get_future().then(lambda fut: fut.value()[0])


class SummingDDP(DDP):
    def prepare(self, model, make_optimizer, precision):
        wrapped, optimizer = super().prepare(model, make_optimizer, precision)
        wrapped.register_comm_hook(None, _sum_hook)
        return wrapped, optimizer


def sum_fsdp_gradients(model) -> None:
    """Tell every FSDP2 unit to divide its reduced gradients by 1: each shard's gradient is the ranks' sum."""
    for module in model.modules():
        if hasattr(module, "set_gradient_divide_factor"):
            module.set_gradient_divide_factor(1.0)


class SummingFSDP(TorchDistributed):
    def prepare(self, model, make_optimizer, precision):
        wrapped, optimizer = super().prepare(model, make_optimizer, precision)
        sum_fsdp_gradients(wrapped)
        return wrapped, optimizer


# Horovod's ranks need horovodrun's rendezvous, so its faulty subclass runs in a script horovodrun starts.
SUMMING_HOROVOD = """
import sys
from gpt2dist.config.schema import RunSpec
from gpt2dist.training.loop import Trainer
from gpt2dist.training.strategies.horovod import Horovod

class SummingHorovod(Horovod):
    def wrap_optimizer(self, model, optimizer):
        return self.hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                             backward_passes_per_step=self.degrees.grad_accum_steps, op=self.hvd.Sum)

spec = RunSpec.model_validate_json(open(sys.argv[1]).read())
strategy = SummingHorovod(spec)
try:
    Trainer(spec, strategy).run()
finally:
    strategy.teardown()
"""


def train_horovod_with_summed_gradients(shards, params_file, out) -> None:
    spec = build_spec(data=shards, out=out, strategy="horovod", precision="fp32", nproc=2, params=load_params(params_file),
                      preset=None, overrides=[])
    out.mkdir(parents=True, exist_ok=True)
    (out / "fault.json").write_text(spec.model_dump_json())
    (out / "fault.py").write_text(SUMMING_HOROVOD)
    subprocess.run([horovodrun_bin(), "-np", "2", "-H", "localhost:2", "--gloo", sys.executable, out / "fault.py",
                    out / "fault.json"], check=True, timeout=300, cwd=REPO)


def _rank_with_fault(rank: int, spec_json: str, port: int, strategy_class, inject) -> None:
    """One rank, in a process of its own: `inject()` plants the fault, then the loop trains."""
    spec = RunSpec.model_validate_json(spec_json)
    as_torchrun_rank(rank, spec.nproc, port)
    if inject:
        inject()
    strategy = strategy_class(spec)
    try:
        Trainer(spec, strategy).run()
    finally:
        strategy.teardown()


def train_with_fault(strategy: str, strategy_class, shards, params_file, out, inject=None, precision: str = "fp32",
                     overrides: list[str] | None = None, nproc: int = 2) -> None:
    """Train `strategy` with strategy_class (a faulty subclass of its engine, or the engine `inject` breaks) on
    `nproc` ranks (as many GPUs where CUDA is visible)."""
    spec = build_spec(data=shards, out=out, strategy=strategy, precision=precision, nproc=nproc,
                      params=load_params(params_file), preset=None, overrides=overrides or [])
    start_ranks(_rank_with_fault, spec.model_dump_json(), free_port(), strategy_class, inject, nprocs=nproc)


def _every_rank_reads_rank_0s_rows() -> None:
    original = BatchSampler.micro_batches
    BatchSampler.micro_batches = lambda self, step, _rank, world, rows: original(self, step, 0, world, rows)


FAULTS = {
    "summed-gradients": lambda shards, params, out: train_with_fault("ddp", SummingDDP, shards, params, out),
    "same-data": lambda shards, params, out: train_with_fault("ddp", DDP, shards, params, out,
                                                              inject=_every_rank_reads_rank_0s_rows),
    "fsdp-summed-gradients": lambda shards, params, out: train_with_fault("fsdp", SummingFSDP, shards, params, out),
    "horovod-summed-gradients": train_horovod_with_summed_gradients,
}


@pytest.mark.slow  # a control: fp32 runs set against bf16 ones
def test_the_same_computation_bound_catches_what_a_precision_changes(reference, single_in, trained):
    """The control of the 1e-6 equalities (a run on emulated nodes against one machine's): it holds for the
    same fp32 computation in two processes, and fails on a change as small as bf16's rounding."""
    assert_same_losses(reference, reference)
    assert_same_losses(reference, trained("ddp", nproc=2))  # two ranks, the same arithmetic up to summation order
    with pytest.raises(AssertionError, match="left .* losses by"):
        assert_same_losses(reference, single_in("bf16"))


def assert_summed_gradients(reference, run, rtol: float = RTOL, ratio_rtol: float = 1e-4) -> None:
    """The divergence summed (not averaged) gradients of two ranks make, and only it: the same steps, step 0's
    gradient norm exactly twice the reference's (same weights, two gradients added), and the run outside the
    equivalence tolerance. A fault that broke something else (a missing step, a crash) fails this."""
    ref_lines, run_lines = read_metrics(reference), read_metrics(run)
    assert [line["step"] for line in run_lines] == [line["step"] for line in ref_lines]
    assert run_lines[0]["grad_norm"] / ref_lines[0]["grad_norm"] == pytest.approx(2.0, rel=ratio_rtol)
    with pytest.raises(AssertionError):
        assert_follows_reference(reference, run, rtol=rtol, atol_params=rtol)


@pytest.mark.slow
@pytest.mark.timeout(400)
@pytest.mark.parametrize("fault", FAULTS)
def test_comparison_catches_injected_fault(fault, reference, shards, params_file, tmp_path):
    FAULTS[fault](shards, params_file, tmp_path)
    if fault.endswith("summed-gradients"):
        assert_summed_gradients(reference, tmp_path)
        return
    first_ref, first_run = read_metrics(reference)[0], read_metrics(tmp_path)[0]
    with pytest.raises(AssertionError):
        assert_follows_reference(reference, tmp_path)
    # half the batch seen twice: the same steps, and the step-0 loss is another sample's loss
    assert [line["step"] for line in read_metrics(tmp_path)] == [line["step"] for line in read_metrics(reference)]
    assert first_run["loss"] != pytest.approx(first_ref["loss"], rel=1e-4)


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_reduced_precision_tolerance_catches_summed_gradients(single_in, shards, params_file, tmp_path):
    """The measured bf16 tolerance is loose enough for rounding (the mixed-precision tests) and tight
    enough that summed gradients in bf16 fall outside it."""
    train_with_fault("ddp", SummingDDP, shards, params_file, tmp_path, precision="bf16")
    with pytest.raises(AssertionError, match="run vs single"):
        assert_follows_in_precision(single_in("fp32"), single_in("bf16"), tmp_path)
