"""The engine's step has the shape a fast step needs, checked by counting what it does rather than by
timing it (timings belong to bench/): one read-back from the device per optimizer step, attention through
the fused SDPA kernel with a causal flag instead of a mask, compiled blocks that are whole graphs and
compile once (or the whole model as one graph), and a loss that never keeps a float32 copy of the logits. Each
check has its fault beside it."""

from __future__ import annotations

import traceback

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from gpt2dist.config.presets import load_params
from gpt2dist.errors import UsageError
from gpt2dist.launch.runner import build_spec
from gpt2dist.training.loop import Trainer
from gpt2dist.training.model import VOCAB_MULTIPLE, chunked_head_loss, compiled_head_loss, head_loss
from gpt2dist.training.strategies import REGISTRY

from conftest import (RESUME_EXTRA, RESUME_STEPS, assert_resumed_exactly, gpt2dist, kill_after_checkpoint,
                      kill_point, run_record, train_args)
from test_equivalence import assert_follows_reference
# The ops through which the host waits for a value the device computed: .item(), float(t), bool(t), `if t`.
READ_BACKS = {torch.ops.aten._local_scalar_dense.default, torch.ops.aten.is_nonzero.default}


class ReadBacks(TorchDispatchMode):
    """Counts host read-backs of tensor values, outside the optimizer: on CPU nothing waits, but the same
    ops on CUDA each stall the queue, so a count here is the count of stalls there. torch's unfused AdamW
    reads its step counters, which it keeps on the host by design (the fused one, used on CUDA, does not)."""

    def __init__(self):
        super().__init__()
        self.seen: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in READ_BACKS:
            stack = traceback.extract_stack()
            if not any("torch/optim/" in frame.filename for frame in stack):
                self.seen.append(f"{func} from {stack[-3].filename}:{stack[-3].lineno}")
        return func(*args, **(kwargs or {}))


def spec_of(shards, params_file, out, *, strategy="single", nproc=1, precision="fp32", overrides=()):
    return build_spec(data=shards, out=out, strategy=strategy, precision=precision, nproc=nproc,
                      params=load_params(params_file), preset=None, overrides=list(overrides))


def trainer(shards, params_file, out, *, precision="fp32", overrides=()) -> Trainer:
    spec = spec_of(shards, params_file, out, precision=precision, overrides=overrides)
    return Trainer(spec, REGISTRY["single"](spec))


def test_the_micro_steps_read_nothing_back(shards, params_file, tmp_path):
    engine = trainer(shards, params_file, tmp_path)
    assert engine.strategy.degrees.grad_accum_steps >= 2  # several micro-steps, so a read-back in their loop would show
    engine.train_step(0)
    with ReadBacks() as counted:
        line = engine.train_step(1)
    # the step's single read-back is one .tolist() of [loss, grad norm], which goes around the dispatcher
    assert counted.seen == []
    assert line["loss"] > 0 and line["grad_norm"] > 0


def test_a_loss_read_back_every_micro_step_is_counted(shards, params_file, tmp_path, monkeypatch):
    """The control: the fault an engine most often carries, the loss read per micro-step for a log line."""
    engine = trainer(shards, params_file, tmp_path)
    forward = engine.strategy.forward

    def logging_each_micro_step(*args, **kwargs):
        loss = forward(*args, **kwargs)
        print(f"micro-step loss {loss.item():.4f}")
        return loss

    monkeypatch.setattr(engine.strategy, "forward", logging_each_micro_step)
    with ReadBacks() as counted:
        engine.train_step(0)
    assert len(counted.seen) == engine.strategy.degrees.grad_accum_steps >= 2


def test_attention_runs_causal_sdpa_without_a_mask(shards, params_file, tmp_path, monkeypatch):
    """The flash and memory-efficient kernels take is_causal; a materialised mask sends SDPA to the slow
    math path (and a 16-bit run must reach it in 16 bits, not upcast)."""
    calls = []
    sdpa = F.scaled_dot_product_attention

    def spy(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, **kwargs):
        calls.append((query.dtype, attn_mask is None, is_causal))
        return sdpa(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    engine = trainer(shards, params_file, tmp_path, precision="bf16")
    engine.train_step(0)
    layers = engine.spec.model.n_layer
    assert len(calls) == layers * engine.strategy.degrees.grad_accum_steps
    assert set(calls) == {(torch.bfloat16, True, True)}


def test_the_loss_takes_a_float16_models_float32_outputs():
    """Apex O2 holds the model (the tied head too) in float16 and casts its forward's outputs to float32: the loss
    casts them to the head's dtype (on an H200 it failed with "expected mat1 and mat2 to have the same dtype")."""
    torch.manual_seed(0)
    hidden, weight = torch.randn(2, 8, 16), torch.randn(500, 16).half()
    targets = torch.randint(0, 500, (2, 8))
    with pytest.raises(RuntimeError, match="same dtype"):  # the fault: the product without the cast
        F.linear(hidden, weight)
    assert head_loss(hidden, weight, targets).item() == head_loss(hidden.half(), weight, targets).item()
    # under autocast the dtypes differ on purpose (bf16 activations, fp32 weight): nothing is cast
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low = hidden.bfloat16()
        assert head_loss(low, weight.float(), targets).item() == F.cross_entropy(
            F.linear(low, F.pad(weight.float(), (0, 0, 0, 12)))[..., :500].float().reshape(-1, 500),
            targets.reshape(-1), reduction="sum").item()


def test_the_loss_pads_the_vocabulary_and_predicts_only_real_tokens():
    torch.manual_seed(0)
    vocab, width = 500, 16
    hidden, weight = torch.randn(2, 8, width), torch.randn(vocab, width)
    targets = torch.randint(0, vocab, (2, 8))
    logits = hidden @ weight.T
    textbook = F.cross_entropy(logits.reshape(-1, vocab), targets.reshape(-1), reduction="sum")
    assert head_loss(hidden, weight, targets).item() == pytest.approx(textbook.item(), rel=1e-6)
    assert -vocab % VOCAB_MULTIPLE == 12  # padded to 512: the control that the padding path ran
    # a softmax over the padded rows too (the fault the slice prevents) gives another number
    padded = F.pad(weight, (0, 0, 0, 12))
    wrong = F.cross_entropy((hidden @ padded.T).reshape(-1, vocab + 12), targets.reshape(-1), reduction="sum")
    assert wrong.item() != pytest.approx(textbook.item(), rel=1e-6)


def saved_float32_logits(loss_fn, hidden, weight, targets) -> list[tuple[int, ...]]:
    """Shapes of the float32 tensors of logits' size that autograd keeps for backward."""
    rows, vocab = targets.numel(), weight.shape[0]
    kept = []

    def pack(tensor):
        if tensor.dtype == torch.float32 and tensor.numel() >= rows * vocab:
            kept.append(tuple(tensor.shape))
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        loss_fn(hidden, weight, targets)
    return kept


@pytest.mark.slow
def test_the_compiled_loss_keeps_no_float32_logits():
    """Under bf16 the eager loss upcasts the logits and keeps the float32 copy (the control); compiled, the
    upcast fuses into the softmax and only 16-bit tensors are saved. Needs a C++ compiler, as inductor does."""
    torch.manual_seed(0)
    hidden = torch.randn(4, 64, 32, dtype=torch.bfloat16, requires_grad=True)
    weight = torch.randn(1000, 32, dtype=torch.bfloat16, requires_grad=True)
    targets = torch.randint(0, 1000, (4, 64))
    assert saved_float32_logits(head_loss, hidden, weight, targets)  # eager: the copy is kept
    assert saved_float32_logits(compiled_head_loss(), hidden, weight, targets) == []


@pytest.mark.slow
def test_compiled_blocks_are_whole_graphs_compiled_once(shards, params_file, tmp_path):
    """fullgraph=True turns a graph break into an error; fail_on_recompile_limit_hit turns an endless
    recompile into one. Here: after the first step, further steps compile nothing new, and evaluation compiles
    its inference graphs once."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    engine = trainer(shards, params_file, tmp_path, overrides=["train.compile=true"])
    assert engine.compiled
    engine.train_step(0)
    graphs = counters["stats"]["unique_graphs"]
    assert graphs >= 2  # the blocks (one code object, so one graph) and the loss
    engine.train_step(1)
    assert counters["stats"]["unique_graphs"] == graphs
    engine.evaluate(2)  # no_grad: inference graphs of the same two, once
    assert counters["stats"]["unique_graphs"] == 2 * graphs
    engine.train_step(2)
    engine.evaluate(3)
    assert counters["stats"]["unique_graphs"] == 2 * graphs
    assert not counters["graph_break"]
    # the control: micro-batches of another shape would compile again, and the counter sees it
    inputs, targets = next(engine.train_batches.micro_batches(3, 0, 1, engine.rows // 2 + 1))
    engine.loss(inputs, targets)
    assert counters["stats"]["unique_graphs"] > graphs


WHOLE = ("train.compile=true", "train.compile_whole_model=true")


@pytest.mark.slow
def test_the_whole_compiled_model_is_one_graph_compiled_once(shards, params_file, tmp_path):
    """train.compile_whole_model: the forward with its loss is one graph (blocks compile as at least two: the
    blocks and the loss), no break, compiled once for training and once for evaluation."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    engine = trainer(shards, params_file, tmp_path, overrides=WHOLE)
    assert engine.compiled
    engine.train_step(0)
    assert counters["stats"]["unique_graphs"] == 1 and not counters["graph_break"]
    engine.train_step(1)
    engine.evaluate(2)  # no_grad: the inference graph of the same forward
    engine.train_step(2)
    assert counters["stats"]["unique_graphs"] == 2 and not counters["graph_break"]
    # its steps ran torch's deterministic algorithms, which end with them: an engine beside it runs as it would alone
    assert not torch.are_deterministic_algorithms_enabled()
    # the control: the same step with its blocks compiled one by one counts more graphs than one
    torch._dynamo.reset()
    counters.clear()
    trainer(shards, params_file, tmp_path / "blocks", overrides=["train.compile=true"]).train_step(0)
    assert counters["stats"]["unique_graphs"] >= 2


def test_the_whole_model_compiles_only_under_single_and_with_compile(shards, params_file, tmp_path):
    """Every other strategy wraps or splits the model, and the switch says how to compile, not whether."""
    with pytest.raises(UsageError, match="train.compile_whole_model applies to --strategy single"):
        spec_of(shards, params_file, tmp_path, strategy="ddp", nproc=2, overrides=WHOLE)
    with pytest.raises(UsageError, match="compile_whole_model says how to compile"):
        spec_of(shards, params_file, tmp_path, overrides=["train.compile_whole_model=true"])
    assert spec_of(shards, params_file, tmp_path, overrides=WHOLE).train.compile_whole_model


GRAPHS = (*WHOLE, "train.cuda_graphs=true")


def test_cuda_graphs_replay_only_the_whole_compiled_model_and_only_on_a_gpu(shards, params_file, tmp_path):
    """A CUDA graph replays the whole model's one compiled graph: refused without it, under another strategy, and
    where no CUDA GPU is (on CPU there is nothing to replay, and a switch that did nothing would be measured)."""
    with pytest.raises(UsageError, match="cuda_graphs replays the whole model's compiled graph"):
        spec_of(shards, params_file, tmp_path, overrides=["train.compile=true", "train.cuda_graphs=true"])
    with pytest.raises(UsageError, match="train.compile_whole_model applies to --strategy single"):
        spec_of(shards, params_file, tmp_path, strategy="ddp", nproc=2, overrides=GRAPHS)
    if torch.cuda.is_available():
        assert spec_of(shards, params_file, tmp_path, overrides=GRAPHS).train.cuda_graphs
    else:
        with pytest.raises(UsageError, match="need a CUDA GPU; on CPU set train.cuda_graphs=false"):
            spec_of(shards, params_file, tmp_path, overrides=GRAPHS)


@pytest.mark.gpu
def test_cuda_graphs_replay_every_step_without_a_skip(shards, params_file, tmp_path):
    """Inductor falls back to launching kernels one by one, with a log line only, where a graph cannot be captured
    (a CPU tensor, a mutated input, a dynamic shape): the step's graphs, training's and evaluation's, are captured."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    engine = trainer(shards, params_file, tmp_path, overrides=GRAPHS)
    for step in range(3):
        engine.train_step(step)
    engine.evaluate(3)
    assert counters["inductor"]["cudagraph_skips"] == 0, dict(counters["inductor"])
    # the control: a graph fed a CPU tensor is not captured, and the counter sees it
    replayed = torch.compile(lambda x, y: x @ y + 1, mode="reduce-overhead")
    replayed(torch.ones(4, 4, device="cuda"), torch.ones(4, 4))
    assert counters["inductor"]["cudagraph_skips"] == 1


def loss_and_grads(loss_fn, hidden, weight, targets) -> tuple[torch.Tensor, ...]:
    hidden, weight = hidden.detach().requires_grad_(), weight.detach().requires_grad_()
    loss = loss_fn(hidden, weight, targets)
    loss.backward()
    return loss.detach(), hidden.grad, weight.grad


@pytest.mark.parametrize("chunk", [1, 7, 16, 1000])
def test_the_chunked_loss_gives_the_whole_losss_value_and_gradients(chunk):
    """Any chunk size (1 token, one that leaves a partial last chunk, an even split, more than the rows) gives
    the loss and both gradients of the whole product, in fp32 to rounding (its softmax is the exponential of the
    log-softmax, the whole loss's backward's own: gradients near 0 differ by about 1e-6)."""
    torch.manual_seed(0)
    hidden, weight, targets = torch.randn(2, 8, 16), torch.randn(500, 16), torch.randint(0, 500, (2, 8))
    expected = loss_and_grads(head_loss, hidden, weight, targets)
    for got, want in zip(loss_and_grads(chunked_head_loss(chunk), hidden, weight, targets), expected):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    with torch.no_grad():  # evaluation takes the same chunks without computing gradients
        torch.testing.assert_close(chunked_head_loss(chunk)(hidden, weight, targets), expected[0], rtol=1e-6, atol=0)
    # the control: a loop that stops at the last whole chunk (a wrong boundary) loses the tail's tokens
    whole = 16 // chunk * chunk
    if whole < 16:
        short = loss_and_grads(chunked_head_loss(chunk), hidden.reshape(16, 16)[:whole], weight,
                               targets.reshape(16)[:whole])
        assert not torch.allclose(short[0], expected[0], rtol=1e-6)


def test_the_chunked_loss_computes_in_the_autocast_dtype_and_keeps_no_logits():
    """Under bf16 autocast each chunk's product is bf16, as the whole loss's is (same value to bf16 rounding),
    and what autograd keeps is two gradients, no tensor of logits' size: the point of chunking."""
    torch.manual_seed(0)
    hidden, weight, targets = torch.randn(4, 64, 32), torch.randn(1000, 32), torch.randint(0, 1000, (4, 64))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        whole = head_loss(hidden, weight, targets)
        chunked = chunked_head_loss(64)(hidden, weight, targets)
        assert chunked.item() == pytest.approx(whole.item(), rel=1e-2)
    rows, vocab = targets.numel(), weight.shape[0]
    for loss_fn, logits_kept in ((head_loss, True), (chunked_head_loss(64), False)):
        kept = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: kept.append(t.numel()) or t, lambda t: t):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss_fn(hidden.requires_grad_(), weight.requires_grad_(), targets)
        assert any(n >= rows * vocab for n in kept) == logits_kept, (loss_fn, kept)


def set_args(*assignments: str) -> tuple[str, ...]:
    """The command line's --set arguments of these key=value assignments."""
    return tuple(arg for assignment in assignments for arg in ("--set", assignment))


CHUNKED = set_args("train.head_loss_chunk_tokens=24")  # a micro-batch's 64 tokens: chunks of 24, 24 and 16
# each engine switch as the --set arguments that turn it on
SWITCHES = {"chunked-loss": CHUNKED, "whole-model-compiled": set_args(*WHOLE),
            "cuda-graphs": set_args(*GRAPHS)}


@pytest.mark.slow
@pytest.mark.timeout(420)
@pytest.mark.parametrize("switch", [pytest.param(switch, marks=[pytest.mark.gpu] if "cuda" in switch else [])
                                    for switch in SWITCHES])
def test_a_run_with_an_engine_switch_follows_todays_and_resumes_exactly(switch, reference, trained, shards,
                                                                        params_file, tmp_path):
    """Each engine switch end to end: the single-process run's curve and final weights within the equivalence
    tolerance of today's eager engine (compiled code and chunks reorder floating-point sums), and killed after a
    checkpoint, resumed bitwise to the uninterrupted run with the switch (the whole model compiled needs torch's
    deterministic algorithms for that: model.deterministic_algorithms)."""
    sets = SWITCHES[switch]
    whole = trained("single", *sets)
    recorded = run_record(whole)["config"]["train"]
    assert all(str(recorded[key.removeprefix("train.")]).lower() == value
               for key, value in (assignment.split("=") for assignment in sets[1::2])), recorded
    assert_follows_reference(reference, whole)
    killed = tmp_path / "killed"
    args = train_args(shards, params_file, killed, "single", *sets, *RESUME_EXTRA)
    kill_after_checkpoint(args, killed, kill_point(f"single-{switch}"))
    gpt2dist(*args)
    assert 0 < run_record(killed)["resumed_from_step"] < RESUME_STEPS
    assert_resumed_exactly(killed, whole)
