"""Data-parallel scaling on this machine: `single` against `ddp` with N ranks, same global
batch, run one after the other through the real `gpt2dist train` command.

    python bench/ddp_scaling.py [--nproc 2] [--preset cpu] [--steps 40] [--warmup 5] [--rounds 3]

Scaling efficiency = ddp tokens/s / (N x single tokens/s), each from the wall time between the
ends of the steps after warm-up (so the host's work between steps counts too), with a 95% interval over interleaved rounds (single, ddp, single, ddp, ...; paired by round). Each run's
record says how busy the machine was; a disturbed run is named. On a CPU the ranks share the
cores that `single` used alone, so read it as the cost of communication and duplicated work,
not as a GPU prediction.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from common import REPO, median, random_shards, ratio_interval, scratch

from gpt2dist.config.presets import load_params
from gpt2dist.errors import OneLineArgumentParser


def throughput(data: Path, out: Path, strategy: str, nproc: int, args) -> tuple[float, float]:
    """Tokens/s over the wall time of the steps after warm-up, and the share of the CPUs other processes
    used meanwhile. Evaluation and checkpoints only after the last step, and no step traced for the ledger:
    nothing but training between the measured steps."""
    subprocess.run([sys.executable, "-m", "gpt2dist", "train", "--data", str(data), "--out", str(out),
                    "--strategy", strategy, "--nproc", str(nproc), "--preset", args.preset,
                    "--params", str(REPO / "params.yaml"), "--max-steps", str(args.steps),
                    "--set", f"train.checkpoint_interval={args.steps}", "--set", f"train.eval_interval={args.steps}",
                    "--set", "train.ledger_steps=0"],
                   check=True, stderr=subprocess.DEVNULL)
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    record = json.loads((out / "run.json").read_text())
    steps = [line for line in lines if line["kind"] == "train"][args.warmup:]
    wall = steps[-1]["end_unix_s"] - steps[0]["end_unix_s"]  # from the end of the first to the end of the last
    return record["tokens_per_step"] * (len(steps) - 1) / wall, record["conditions"]["foreign_cpu_share_mean"]


def main() -> None:
    parser = OneLineArgumentParser(__doc__)
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--preset", default="cpu")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    data = random_shards(load_params(REPO / "params.yaml").preset(args.preset)[1].model.vocab_size)
    work = scratch("gpt2dist-scaling-")
    single, ddp, busy = [], [], []
    for r in range(args.rounds):
        for name, nproc, rates in (("single", 1, single), ("ddp", args.nproc, ddp)):
            rate, foreign = throughput(data, work / f"{name}-r{r}", name, nproc, args)
            rates.append(rate)
            if foreign is not None and foreign > 0.1:
                busy.append(f"{name} round {r} ({foreign:.0%} of the CPUs used by other processes)")
    print(f"preset={args.preset} steps={args.steps} (wall time after {args.warmup} warm-up steps), {args.rounds} rounds")
    print(f"single        {median(single):10,.0f} tokens/s (median of rounds)")
    print(f"ddp x{args.nproc}        {median(ddp):10,.0f} tokens/s")
    speedup, low, high, pairs = ratio_interval(ddp, single)
    print(f"speedup {speedup:.2f}x (95% interval {low:.2f} to {high:.2f}), scaling efficiency "
          f"{speedup / args.nproc:.2f} ({low / args.nproc:.2f} to {high / args.nproc:.2f}), {pairs} paired rounds")
    print("disturbed runs: " + ("; ".join(busy) if busy else "none"))


if __name__ == "__main__":
    main()
