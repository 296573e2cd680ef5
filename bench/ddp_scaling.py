"""Data-parallel scaling on this machine: `single` against `ddp` with N ranks, same global
batch, run one after the other through the real `gpt2dist train` command.

    python bench/ddp_scaling.py [--nproc 2] [--preset cpu] [--steps 40] [--warmup 5]

Scaling efficiency = ddp tokens/s / (N x single tokens/s), medians after warm-up steps.
On a CPU the ranks share the cores that `single` used alone, so read it as the cost of
communication and duplicated work, not as a GPU prediction.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from common import REPO, median, random_shards

from gpt2dist.config import load_preset


def throughput(data: Path, out: Path, strategy: str, nproc: int, args) -> float:
    subprocess.run([sys.executable, "-m", "gpt2dist", "train", "--data", str(data), "--out", str(out),
                    "--strategy", strategy, "--nproc", str(nproc), "--preset", args.preset,
                    "--params", str(REPO / "params.yaml"), "--max-steps", str(args.steps),
                    "--set", f"train.checkpoint_interval={args.steps}"],
                   check=True, stderr=subprocess.DEVNULL)
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return median([line["tokens_per_s"] for line in lines if line["kind"] == "train"][args.warmup:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--preset", default="cpu")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=5)
    args = parser.parse_args()
    data = random_shards(load_preset(REPO / "params.yaml", args.preset).model.vocab_size)
    work = Path(tempfile.mkdtemp(prefix="gpt2dist-scaling-"))
    single = throughput(data, work / "single", "single", 1, args)
    ddp = throughput(data, work / "ddp", "ddp", args.nproc, args)
    print(f"preset={args.preset} steps={args.steps} (median after {args.warmup} warm-up steps)")
    print(f"single        {single:10,.0f} tokens/s")
    print(f"ddp x{args.nproc}        {ddp:10,.0f} tokens/s")
    print(f"speedup {ddp / single:.2f}x, scaling efficiency {ddp / (args.nproc * single):.2f}")


if __name__ == "__main__":
    main()
