"""What a CPU run's launch costs: the same small ddp run started by torchrun with fresh interpreters as ranks
(as on GPUs) and by forking_torchrun (ranks forked from a process that imported them, as on CPUs).

    python bench/launch_cost.py [--nproc 2 4] [--rounds 5] [--steps 6]

Each round runs the same spec both ways, one after the other (the order alternates), from the launcher's start
to its end; wall time and the CPU time of the launcher and its ranks (their user and system time, as the
kernel accounts children). Prints each way's medians and forked / fresh with a 95% interval over the rounds,
and how busy the machine was meanwhile.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from common import REPO, machine_line, median, random_shards, ratio_interval, timed_command

from gpt2dist.config.presets import load_params
from gpt2dist.errors import OneLineArgumentParser
from gpt2dist.launch.commands import launch_env, local_command
from gpt2dist.system.conditions import LoadMonitor

WAYS = {"fresh": "cuda", "forked": "cpu"}  # the device whose command each way is: what local_command starts there
LEFT_BY_A_RUN = ("checkpoint.pt", "metrics.jsonl", "rank0.json", "run.json")


def spec_for(data: Path, out: Path, nproc: int, steps: int) -> Path:
    """The resolved spec of a small ddp run, as `gpt2dist train --print-command` writes it."""
    subprocess.run([sys.executable, "-m", "gpt2dist", "train", "--data", str(data), "--out", str(out),
                    "--strategy", "ddp", "--nproc", str(nproc), "--preset", "cpu", "--params", str(REPO / "params.yaml"),
                    "--max-steps", str(steps), "--set", f"train.checkpoint_interval={steps}",
                    "--set", f"train.eval_interval={steps}", "--print-command"], check=True, stdout=subprocess.DEVNULL)
    return out / "spec.json"


def launch(command: list[str], nproc: int, out: Path) -> tuple[float, float]:
    """Wall seconds and CPU seconds (launcher and ranks) of one launch of a fresh run."""
    for name in LEFT_BY_A_RUN:
        (out / name).unlink(missing_ok=True)
    return timed_command(command, launch_env(nproc))


def main() -> None:
    parser = OneLineArgumentParser(__doc__)
    parser.add_argument("--nproc", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()
    data = random_shards(vocab=load_params(REPO / "params.yaml").preset("cpu")[1].model.vocab_size, tokens=200_000)
    with LoadMonitor() as monitor:
        for nproc in args.nproc:
            out = data / f"run-n{nproc}"
            spec = spec_for(data, out, nproc, args.steps)
            measured: dict[str, list[tuple[float, float]]] = {way: [] for way in WAYS}
            for round_ in range(args.rounds):
                order = list(WAYS) if round_ % 2 == 0 else list(reversed(WAYS))
                for way in order:
                    measured[way].append(launch(local_command("torchrun", nproc, spec, WAYS[way]), nproc, out))
                print(f"  {nproc} ranks, round {round_ + 1}/{args.rounds}", file=sys.stderr)
            for index, what in ((0, "wall"), (1, "CPU")):
                fresh = [m[index] for m in measured["fresh"]]
                forked = [m[index] for m in measured["forked"]]
                ratio, low, high, pairs = ratio_interval(forked, fresh)
                print(f"{nproc} ranks, {args.steps} steps, {what}: fresh interpreters {median(fresh):.2f} s, forked "
                      f"{median(forked):.2f} s (medians); forked / fresh = {ratio:.3f} (95% interval {low:.3f} to "
                      f"{high:.3f}, {pairs} interleaved rounds)")
    print(machine_line(monitor))


if __name__ == "__main__":
    main()
