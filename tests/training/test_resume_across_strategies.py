"""A run continues under another strategy and process count (`gpt2dist train --resume-from`): one chain of runs passes
the training on, two steps each, through every strategy the engine runs on CPU (and each pipeline schedule) and the
splits of test_splits.py (3-D on eight processes among them), from one process to eight and back, and follows
single's uninterrupted run step for step (fp32, the equivalence tolerance). Each link's spec is written by the CLI
(`--print-command`, which checks the continuation as a run does) and its ranks run the ranks' own entry point, forked
from the suite's forkserver instead of behind a launcher of their own each (conftest's train_in_forked_ranks: a
launch spends seconds importing and starting, and the chain has twenty links); horovod's, which needs horovodrun, is
launched: a CLI continuation, as the control's and the refusals are.
Its control: a checkpoint whose AdamW moments were lost continues off that curve. What cannot be continued is
refused, saying why: another computation, or a path with no checkpoint. (Apex amp's optimizer state, kept by
position, is refused too: a GPU path, training.checkpoint's own check.)"""

from __future__ import annotations

import pytest
import torch
from test_equivalence import ATOL_PARAMS, RTOL

from gpt2dist.config.strategies import describe

from conftest import TINY_PRESET, final_params, gpt2dist, read_metrics, run_record, train_args, train_in_forked_ranks

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def schedule(name: str) -> tuple[str, ...]:
    return ("--set", f"train.pipeline_schedule={name}")


# each strategy (and pipeline schedule) once as the one continued and once as the one continuing: strategy,
# processes, its options
CHAIN = [("single", 1, ()), ("ddp", 2, ()), ("horovod", 2, ()), ("zero1", 2, ()), ("fsdp", 2, ()), ("hsdp", 4, ()),
         ("tp", 2, ()), ("fsdp-tp", 4, ()), ("ddp-tp2-pp2", 8, ()), ("fsdp-pp2", 4, ()), ("tp2-pp2", 4, ()),
         ("ddp-tp2", 4, ()), ("ddp-pp2", 4, ()), ("zero2", 2, ()), ("pp", 2, ()),
         ("pp", 2, schedule("interleaved-1f1b")), ("pp", 2, schedule("zero-bubble")), ("pp", 2, schedule("gpipe")),
         ("dp", 1, ()), ("single", 1, ())]
STEPS_EACH = 2
# The cosine decay is laid out over max_steps: a flat tail (min_lr = lr) makes the learning rate a function of
# the step alone, so links of 2, 4, 6, ... steps and the whole run apply the same one. Four blocks: two
# stages of two blocks per rank for the interleaved schedules.
FLAT = ("--set", f"train.min_lr={TINY_PRESET['train']['lr']}", "--set", "model.n_layer=4")
TIMEOUT_S = 240


def continuation(options: tuple[str, ...], steps: int, previous) -> list[str]:
    """The train arguments of a run to `steps` that continues `previous` (None: from the start)."""
    return [*FLAT, *options, "--max-steps", str(steps), *(["--resume-from", str(previous)] if previous else [])]


def continued(shards, params_file, out, strategy: str, nproc: int, options: tuple[str, ...], steps: int,
              previous=None, check=True):
    return gpt2dist(*train_args(shards, params_file, out, strategy, *continuation(options, steps, previous),
                                nproc=nproc), check=check, timeout=TIMEOUT_S)


def off_curve(expected: list[dict], got: list[dict]) -> list[tuple]:
    """Steps whose loss or gradient norm leaves the uninterrupted run's by more than RTOL."""
    assert [line["step"] for line in got] == [line["step"] for line in expected]
    return [(a["step"], key, a[key], b[key]) for a, b in zip(expected, got) for key in ("loss", "grad_norm")
            if abs(a[key] - b[key]) > RTOL * abs(a[key])]


def link(shards, params_file, out, strategy: str, nproc: int, options: tuple[str, ...], steps: int, previous) -> None:
    """One link of the chain (the module's docstring says how it runs)."""
    if describe(strategy).launcher == "horovodrun":
        continued(shards, params_file, out, strategy, nproc, options, steps, previous)
        return
    train_in_forked_ranks(shards, params_file, out, strategy, *continuation(options, steps, previous), nproc=nproc)


@pytest.fixture(scope="module")
def whole(shards, params_file, tmp_path_factory):
    out = tmp_path_factory.mktemp("whole")
    continued(shards, params_file, out, "single", 1, (), STEPS_EACH * len(CHAIN))
    return out


@pytest.fixture(scope="module")
def chain(shards, params_file, tmp_path_factory) -> list:
    """The chain's run directories, link by link, each continuing the one before."""
    root, links = tmp_path_factory.mktemp("chain"), []
    for position, (strategy, nproc, options) in enumerate(CHAIN):
        out = root / f"{position}-{strategy}-n{nproc}"
        link(shards, params_file, out, strategy, nproc, options, STEPS_EACH * (position + 1),
             links[-1] if links else None)
        links.append(out)
    return links


def test_a_run_passed_through_every_strategy_follows_singles(whole, chain):
    for position, out in enumerate(chain):
        record = run_record(out)
        assert record["resumed_from_step"] == STEPS_EACH * position
        if position:
            assert record["continued_from"] == {"checkpoint": str(chain[position - 1] / "checkpoint.pt"),
                                                "step": STEPS_EACH * position, "strategy": CHAIN[position - 1][0],
                                                "nproc": CHAIN[position - 1][1]}
    assert off_curve(read_metrics(whole), read_metrics(chain[-1])) == []
    got, expected = without_key_biases(final_params(chain[-1])), without_key_biases(final_params(whole))
    assert got.keys() == expected.keys()
    for name, tensor in expected.items():
        torch.testing.assert_close(got[name], tensor, rtol=0, atol=ATOL_PARAMS, msg=name)


def without_key_biases(params: dict) -> dict:
    """The parameters with the key third of each c_attn bias left out: its gradient is zero but for rounding (a
    shift that every key shares leaves the softmax unchanged), and AdamW's normalised step turns rounding noise
    into steps of up to lr, so two summation orders make it drift apart by design (2e-5 after 22 steps here,
    while every other parameter stays within 3e-7)."""
    kept = dict(params)
    for name, tensor in params.items():
        if name.endswith("attn.c_attn.bias"):
            width = tensor.numel() // 3
            kept[name] = torch.cat([tensor[:width], tensor[2 * width:]])
    return kept


def test_a_checkpoint_that_lost_its_adam_moments_continues_off_the_curve(whole, chain, shards, params_file,
                                                                          tmp_path):
    """Control: the chain's second hand-over (ddp's checkpoint to horovod) with AdamW's moments zeroed in the
    file is caught by the same check."""
    checkpoint = torch.load(chain[1] / "checkpoint.pt", weights_only=False)
    for state in checkpoint["optimizer"]["state"].values():
        state["exp_avg"].zero_()
        state["exp_avg_sq"].zero_()
    (tmp_path / "broken").mkdir()
    torch.save(checkpoint, tmp_path / "broken" / "checkpoint.pt")
    out = tmp_path / "after"
    continued(shards, params_file, out, *CHAIN[2], STEPS_EACH * 3, tmp_path / "broken")
    steps = len(read_metrics(out))
    missed = off_curve(read_metrics(whole)[:steps], read_metrics(out))
    # step 4's loss comes from the handed-over weights; the first update with the lost moments shows at step 5
    assert {step for step, *_ in missed} >= {STEPS_EACH * 2 + 1}, missed


def test_what_cannot_be_continued_is_refused(chain, shards, params_file, tmp_path):
    out = tmp_path / "refused"
    result = gpt2dist(*train_args(shards, params_file, out, "ddp", *FLAT, "--seed", "8", "--max-steps", "4",
                                  "--resume-from", str(chain[0]), nproc=2), check=False, timeout=TIMEOUT_S)
    record = run_record(out)  # the ranks refuse it; the record keeps the line that says why
    assert result.returncode != 0 and "computes something else" in record["error"], result.stderr[-2000:]
    assert record["status"] == "failed" and read_metrics(out) == []
    result = gpt2dist(*train_args(shards, params_file, tmp_path / "none", "ddp", "--resume-from",
                                  str(tmp_path / "nowhere"), nproc=2), check=False)
    assert result.returncode != 0 and result.stderr.strip().startswith("error: --resume-from ")
    assert len(result.stderr.strip().splitlines()) == 1 and not (tmp_path / "none").exists()
