"""Benchmark helpers: throwaway shards, a real single-process Trainer built from a preset, and the
verdict on a target: a ratio with its 95% interval over interleaved rounds (paired by round),
and how busy the machine was meanwhile, so a noisy machine says so instead of printing a number."""

from __future__ import annotations

import atexit
import os
import resource
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

from gpt2dist.data.shards import write_shards
from gpt2dist.launch.runner import build_spec
from gpt2dist.results.statistics import paired_ratio
from gpt2dist.system.conditions import LoadMonitor
from gpt2dist.training.loop import Trainer
from gpt2dist.training.strategies import REGISTRY

REPO = Path(__file__).resolve().parents[1]


def scratch(prefix: str = "gpt2dist-bench-") -> Path:
    """A temporary directory that goes when the benchmark exits, instead of staying in /tmp after every run (a
    rank forked from the benchmark leaves it to its parent)."""
    directory, owner = Path(tempfile.mkdtemp(prefix=prefix)), os.getpid()

    def remove() -> None:
        if os.getpid() == owner:
            shutil.rmtree(directory, ignore_errors=True)

    atexit.register(remove)
    return directory


def random_shards(vocab: int, tokens: int = 2_000_000) -> Path:
    """Uniform random tokens: throughput does not depend on what the text says."""
    directory = scratch()
    rng = np.random.default_rng(0)
    write_shards(directory, {"train": [rng.integers(0, vocab, tokens)], "val": [rng.integers(0, vocab, tokens // 10)]},
                 vocab_size=vocab, eos_id=vocab - 1, tokenizer={"name": "random"}, source={"name": "random"})
    return directory


def timed_command(command: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Wall seconds and CPU seconds (user and system, as the kernel accounts the command and the children it
    waited for) of one run of `command`, its output discarded."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run(command, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def single_trainer(preset: str, precision: str, overrides: list[str]) -> Trainer:
    from gpt2dist.config.presets import load_params

    params = load_params(REPO / "params.yaml")
    data = random_shards(params.preset(preset, overrides=overrides)[1].model.vocab_size)
    spec = build_spec(data=data, out=data / "run", strategy="single", precision=precision, nproc=1, params=params,
                      preset=preset, overrides=overrides)
    return Trainer(spec, REGISTRY["single"](spec))


def bare_loop(trainer, steps: int) -> float:
    """The textbook loop over the trainer's model, optimizer and batch: forward, loss (the logits in full),
    backward, clip, step, zero_grad, read the loss; tokens/s."""
    model, optimizer, precision = trainer.model, trainer.optimizer, trainer.precision
    spec, device = trainer.spec, trainer.place.device
    accum = trainer.strategy.degrees.grad_accum_steps
    batches = [tuple(t.to(device) for t in b)
               for b in trainer.train_batches.micro_batches(0, 0, 1, spec.train.micro_batch_size)]
    scaler = precision.scaler
    started = time.perf_counter()
    for _ in range(steps):
        for inputs, targets in batches:
            with precision.autocast():
                hidden = model(inputs)
                logits = F.linear(hidden, model.lm_head.weight)  # the model leaves its tied head to the loss
                loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1)) / accum
            (scaler.scale(loss) if scaler else loss).backward()
        if scaler:
            scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), spec.train.grad_clip)
        if scaler:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        optimizer.zero_grad()
        loss.item()
    return steps * trainer.tokens_per_step / (time.perf_counter() - started)


def engine(trainer, first_step: int, steps: int, lines: list[dict] | None = None) -> float:
    """`steps` optimizer steps of the trainer from `first_step`; tokens/s. Their metrics lines (GPU
    telemetry included) go to `lines` when given."""
    started = time.perf_counter()
    for step in range(first_step, first_step + steps):
        line = trainer.train_step(step)
        if lines is not None:
            lines.append(line)
    return steps * trainer.tokens_per_step / (time.perf_counter() - started)


def median(values: list[float]) -> float:
    return statistics.median(values)


def ratio_interval(ours: list[float], theirs: list[float]) -> tuple[float, float, float, int]:
    """ours[i] / theirs[i] over rounds i: geometric mean and 95% log-scale interval."""
    return paired_ratio(pd.Series(ours, dtype=float), pd.Series(theirs, dtype=float))


def decided(ours: list[float], theirs: list[float], target: float) -> bool:
    """Whether the interval already lies wholly above or below the target."""
    _, low, high, _ = ratio_interval(ours, theirs)
    return low >= target or high < target


def against_target(low: float, high: float, target: float) -> str:
    """An interval's verdict on a 'higher is better' target."""
    if low >= target:
        return f"meets the target >= {target:g}"
    if high < target:
        return f"misses the target >= {target:g}"
    return f"cannot decide against the target >= {target:g}"


def verdict_line(name: str, ours: list[float], theirs: list[float], target: float) -> str:
    ratio, low, high, pairs = ratio_interval(ours, theirs)
    measured = f"{name} = {ratio:.3f} (95% interval {low:.3f} to {high:.3f}, {pairs} interleaved rounds)"
    line = f"{measured}: {against_target(low, high, target)}"
    if low < target <= high:
        line += "; the machine was too noisy for this many rounds (raise --max-rounds, or run on a quiet machine)"
    return line


def machine_line(monitor: LoadMonitor) -> str:
    summary = monitor.summary()
    mean, peak = summary["foreign_cpu_share_mean"], summary["foreign_cpu_share_max"]
    if mean is None:
        return "other processes' CPU share: not sampled (too short)"
    note = "  <- disturbed: read the numbers above with care" if mean > 0.1 else ""
    return f"other processes used {mean:.0%} of this run's CPUs on average (at most {peak:.0%}){note}"
