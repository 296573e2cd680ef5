"""Engine overhead: `single` through gpt2dist's Trainer against a minimal hand-written loop
over the same transformers model, batch and precision, interleaved in one process.

    python bench/engine_overhead.py [--preset cpu] [--precision fp32] [--min-rounds 5] [--max-rounds 40] [--steps 10]

Prints tokens/s of both and their ratio with a 95% interval over interleaved rounds (target:
engine >= 0.97 x minimal loop). Rounds continue until the interval lies wholly above or below the
target, or --max-rounds, when it says the machine was too noisy to decide.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F
from common import LoadMonitor, decided, machine_line, median, single_trainer, verdict_line

TARGET = 0.97


def minimal_loop(trainer, steps: int) -> float:
    """The textbook loop: forward, loss, backward, clip, step, zero_grad, log the loss."""
    model, optimizer, precision = trainer.model, trainer.optimizer, trainer.precision
    spec, device = trainer.spec, trainer.place.device
    accum = spec.grad_accum_steps
    batches = [tuple(t.to(device) for t in b)
               for b in trainer.train_batches.micro_batches(0, 0, 1, spec.train.micro_batch_size)]
    scaler = precision.scaler
    started = time.perf_counter()
    for _ in range(steps):
        for inputs, targets in batches:
            with precision.autocast():
                logits = model(input_ids=inputs, use_cache=False, return_dict=False)[0]
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


def engine(trainer, first_step: int, steps: int) -> float:
    started = time.perf_counter()
    for step in range(first_step, first_step + steps):
        trainer.train_step(step)
    return steps * trainer.tokens_per_step / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="cuda" if torch.cuda.is_available() else "cpu",
                        help="params.yaml preset (default: paper on CUDA, cpu otherwise)")
    parser.add_argument("--precision", default="bf16" if torch.cuda.is_available() else "fp32")
    parser.add_argument("--min-rounds", type=int, default=5)
    parser.add_argument("--max-rounds", type=int, default=40)
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    preset = "paper" if args.preset == "cuda" else args.preset
    trainer = single_trainer(preset, args.precision, ["train.compile=false"])
    engine(trainer, 0, 3)  # warm-up both paths (allocator, kernels)
    minimal_loop(trainer, 3)
    ours, theirs = [], []
    with LoadMonitor() as monitor:
        for r in range(args.max_rounds):  # interleaved so drift and noise hit both alike
            ours.append(engine(trainer, 3 + r * args.steps, args.steps))
            theirs.append(minimal_loop(trainer, args.steps))
            if r + 1 >= args.min_rounds and decided(ours, theirs, TARGET):
                break
    print(f"preset={preset} precision={args.precision} device={trainer.place.device} "
          f"tokens/step={trainer.tokens_per_step} rounds={len(ours)}x{args.steps} steps")
    print(f"engine       {median(ours):12,.0f} tokens/s (median of rounds)")
    print(f"minimal loop {median(theirs):12,.0f} tokens/s")
    print(verdict_line("engine/minimal", ours, theirs, TARGET))
    print(machine_line(monitor))


if __name__ == "__main__":
    main()
