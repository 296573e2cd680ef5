"""The planner's memory model against measured peaks: each strategy the node can run, trained a few steps
through the real `gpt2dist train`, its predicted bytes per rank (config.memory) beside what the run measured.

    python bench/memory_model.py [--preset paper] [--precision bf16] [--nproc N] [--steps 3] [--set key=value ...]
                                [--strategies single,ddp,fsdp]

On GPUs the peak is torch.cuda.max_memory_allocated on rank 0; target: predicted within 10% of it. On CPUs the
peak is the process's resident set, which counts the Python and torch runtime too, so only the model state is
compared there (collect checks the state on every run as well).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from gpt2dist.config.memory import predict
from gpt2dist.config.presets import load_params
from gpt2dist.config.schema import STRATEGY_NAMES, RunSpec
from gpt2dist.config.strategies import check_run, describe, REFERENCE
from gpt2dist.errors import OneLineArgumentParser, UsageError
from gpt2dist.system.hardware import cuda_gpus

TARGET = 0.10
MIB = 2**20


def trained(params: Path, data: Path, out: Path, strategy: str, nproc: int, args) -> tuple[dict, int]:
    """The run's record and its measured peak over the steps."""
    sets = [item for key in args.overrides for item in ("--set", key)]
    subprocess.run([sys.executable, "-m", "gpt2dist", "train", "--data", str(data), "--out", str(out),
                    "--strategy", strategy, "--nproc", str(nproc), "--precision", args.precision,
                    "--preset", args.preset, "--params", str(params), "--max-steps", str(args.steps),
                    "--set", f"train.checkpoint_interval={args.steps}", "--set", f"train.eval_interval={args.steps}",
                    "--set", "train.ledger_steps=0", "--set", "train.compile=false", *sets],
                   check=True, stderr=subprocess.DEVNULL)
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    peak = max(line["peak_mem_bytes"] for line in lines if line["kind"] == "train")
    return json.loads((out / "run.json").read_text()), peak


def runnable(params: Path, strategy: str, nproc: int, args, device: str, gpus: int) -> str | None:
    """Why this node cannot run the strategy at nproc, or None."""
    preset = load_params(params).preset(args.preset, overrides=args.overrides)[1]
    spec = RunSpec(data_dir="", out_dir="", preset=args.preset, strategy=strategy, precision=args.precision,
                   nproc=nproc, device=device, model=preset.model, train=preset.train)
    try:
        check_run(spec, gpus)
    except UsageError as exc:
        return str(exc)
    return None


def main() -> None:
    gpus = cuda_gpus()
    parser = OneLineArgumentParser(__doc__)
    parser.add_argument("--preset", default="paper" if gpus else "cpu")
    parser.add_argument("--precision", default="bf16")
    parser.add_argument("--nproc", type=int, default=max(gpus, 2), help="processes of every multi-process strategy")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="preset override key=value")
    parser.add_argument("--strategies", default=",".join(STRATEGY_NAMES), help="comma-separated; default: every strategy")
    args = parser.parse_args()
    try:
        strategies = [describe(name).name for name in args.strategies.split(",")]
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    # only now: a refused list costs no import of torch (seconds of CPU, most of a refusal's time)
    import torch
    from common import REPO, random_shards, scratch

    params = REPO / "params.yaml"
    device = "cuda" if gpus else "cpu"
    vocab = load_params(params).preset(args.preset, overrides=args.overrides)[1].model.vocab_size
    data, work = random_shards(vocab), scratch("gpt2dist-memory-")
    print(f"preset={args.preset} precision={args.precision} device={device} "
          f"{torch.cuda.get_device_name(0) if gpus else ''}".rstrip())
    print(f"{'configuration':<18} {'state MiB: predicted':>21} {'measured':>9} "
          + (f"{'peak MiB: predicted':>20} {'measured':>9} {'ratio':>6}  verdict" if gpus else ""))
    misses = []
    for strategy in strategies:
        nproc = 1 if strategy == REFERENCE else args.nproc
        why = runnable(params, strategy, nproc, args, device, gpus)
        if why:
            print(f"{strategy}-n{nproc}: not run here: {why}")
            continue
        record, peak = trained(params, data, work / f"{strategy}-n{nproc}", strategy, nproc, args)
        predicted = predict(RunSpec.model_validate(record["config"]), busiest=False)  # rank 0, as measured
        line = (f"{f'{strategy}-n{nproc}':<18} {predicted.state / MIB:>21,.1f} "
                f"{record['model_state_bytes']['total'] / MIB:>9,.1f}")
        if gpus:
            ratio = predicted.peak / peak
            verdict = "within target" if abs(ratio - 1) <= TARGET else f"misses the {TARGET:.0%} target"
            if abs(ratio - 1) > TARGET:
                misses.append(strategy)
            line += f" {predicted.peak / MIB:>20,.1f} {peak / MIB:>9,.1f} {ratio:>6.2f}  {verdict}"
        print(line)
    if gpus:
        print("peak beyond the target: " + (", ".join(misses) if misses else "none"))


if __name__ == "__main__":
    main()
