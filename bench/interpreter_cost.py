"""What the venv's Python costs a launch: the same commands run by this venv's interpreter and by another venv's
(say one made with PYTHON=python3, against setup_env.sh's pick), one after the other in each round, the order
alternating, both importing this checkout's gpt2dist.

    python bench/interpreter_cost.py OTHER_VENV [--rounds 5] [--steps 6]

Each round times, in CPU seconds (user and system, the command's and its children's): `import torch, torch._dynamo`,
a 1-process and a 2-rank `gpt2dist train` of the cpu preset's model, and `gpt2dist validate-published` (gpt2dist
without torch). Prints each command's medians and this / other with a 95% interval over the rounds, and how busy
the machine was meanwhile.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from common import REPO, machine_line, median, random_shards, ratio_interval, timed_command

from gpt2dist.config.presets import load_params
from gpt2dist.errors import OneLineArgumentParser
from gpt2dist.system.conditions import QUIET_WAIT_ENV, LoadMonitor


def commands(python: str, data: Path, steps: int) -> dict[str, list[str]]:
    def train(strategy: str, nproc: int) -> list[str]:
        return [python, "-m", "gpt2dist", "train", "--data", str(data), "--out", str(data / f"run-{strategy}"),
                "--strategy", strategy, "--nproc", str(nproc), "--preset", "cpu", "--params", str(REPO / "params.yaml"),
                "--max-steps", str(steps), "--set", f"train.checkpoint_interval={steps}",
                "--set", f"train.eval_interval={steps}"]

    return {"import torch": [python, "-c", "import torch, torch._dynamo"], "train single": train("single", 1),
            "train ddp, 2 ranks": train("ddp", 2),
            "validate-published": [python, "-m", "gpt2dist", "validate-published"]}


def cpu_seconds(command: list[str], data: Path) -> float:
    """The CPU time of one run of `command` and its children; a train command starts a fresh run."""
    for run in data.glob("run-*"):
        shutil.rmtree(run)
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), QUIET_WAIT_ENV: "0"}  # this checkout's gpt2dist, no wait
    return timed_command(command, env)[1]


def main() -> None:
    parser = OneLineArgumentParser(__doc__)
    parser.add_argument("other_venv", type=Path, help="the venv to hold this one against (its bin/python)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()
    pythons = {"this": sys.executable, "other": str(args.other_venv / "bin" / "python")}
    if not Path(pythons["other"]).is_file():
        parser.error(f"{args.other_venv} has no bin/python: name a venv made by setup_env.sh (VENV=... PYTHON=...)")
    for way, python in pythons.items():
        version = subprocess.run([python, "-c", "import sys, torch; print(sys.version.split()[0], torch.__version__)"],
                                 capture_output=True, text=True, check=True).stdout.strip()
        print(f"{way}: {Path(python).resolve()} (Python and torch {version})")
    data = random_shards(vocab=load_params(REPO / "params.yaml").preset("cpu")[1].model.vocab_size, tokens=200_000)
    measured: dict[str, dict[str, list[float]]] = {}
    with LoadMonitor() as monitor:
        for round_ in range(args.rounds):
            order = list(pythons) if round_ % 2 == 0 else list(reversed(pythons))
            for way in order:
                for name, command in commands(pythons[way], data, args.steps).items():
                    measured.setdefault(name, {w: [] for w in pythons})[way].append(cpu_seconds(command, data))
            print(f"  round {round_ + 1}/{args.rounds}", file=sys.stderr)
    for name, ways in measured.items():
        ratio, low, high, pairs = ratio_interval(ways["this"], ways["other"])
        print(f"{name}: this {median(ways['this']):.2f} CPU-s, other {median(ways['other']):.2f} CPU-s (medians); "
              f"this / other = {ratio:.3f} (95% interval {low:.3f} to {high:.3f}, {pairs} interleaved rounds)")
    print(machine_line(monitor))
    shutil.rmtree(data)


if __name__ == "__main__":
    main()
