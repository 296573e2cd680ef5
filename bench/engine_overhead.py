"""Engine overhead: `single` through gpt2dist's Trainer against a bare hand-written loop
over the same GPT-2 model, batch and precision, interleaved in one process.

    python bench/engine_overhead.py [--preset cpu] [--precision fp32] [--min-rounds 5] [--max-rounds 40] [--steps 10]

Prints tokens/s of both and their ratio with a 95% interval over interleaved rounds (target:
engine >= 0.97 x bare loop). Rounds continue until the interval lies wholly above or below the
target, or --max-rounds, when it says the machine was too noisy to decide.
"""

from __future__ import annotations

import torch
from common import (
    LoadMonitor,
    bare_loop,
    decided,
    engine,
    machine_line,
    median,
    single_trainer,
    verdict_line,
)

from gpt2dist.errors import OneLineArgumentParser

TARGET = 0.97


def main() -> None:
    parser = OneLineArgumentParser(__doc__)
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
    bare_loop(trainer, 3)
    ours, theirs = [], []
    with LoadMonitor() as monitor:
        for r in range(args.max_rounds):  # interleaved so drift and noise hit both alike
            ours.append(engine(trainer, 3 + r * args.steps, args.steps))
            theirs.append(bare_loop(trainer, args.steps))
            if r + 1 >= args.min_rounds and decided(ours, theirs, TARGET):
                break
    print(f"preset={preset} precision={args.precision} device={trainer.place.device} "
          f"tokens/step={trainer.tokens_per_step} rounds={len(ours)}x{args.steps} steps")
    print(f"engine       {median(ours):12,.0f} tokens/s (median of rounds)")
    print(f"bare loop    {median(theirs):12,.0f} tokens/s")
    print(verdict_line("engine/bare loop", ours, theirs, TARGET))
    print(machine_line(monitor))


if __name__ == "__main__":
    main()
