"""What a launch costs, this venv and checkout against another venv (say one made with PYTHON=python3, against
setup_env.sh's pick, both importing this checkout's gpt2dist) or another checkout of gpt2dist (a `git worktree` of
an earlier commit, imported by this venv's Python): the same commands both ways, one after the other in each round,
the order alternating.

    python bench/interpreter_cost.py OTHER [--rounds 5] [--steps 6]

Each round times, in wall and CPU seconds (user and system, the command's and its children's): `import torch,
torch._dynamo`, a 1-process and a 2-rank `gpt2dist train` of the cpu preset's model, and `gpt2dist
validate-published` (gpt2dist without torch). Prints each command's medians and this / other with a 95% interval
over the rounds, and how busy the machine was meanwhile.
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


def seconds(command: list[str], data: Path, source: Path) -> tuple[float, float]:
    """Wall and CPU time of one run of `command` and its children, importing gpt2dist from `source`; a train
    command starts a fresh run."""
    for run in data.glob("run-*"):
        shutil.rmtree(run)
    return timed_command(command, {**os.environ, "PYTHONPATH": str(source), QUIET_WAIT_ENV: "0"})  # no wait


def main() -> None:
    parser = OneLineArgumentParser(__doc__)
    parser.add_argument("other", type=Path, help="the venv (its bin/python) or the checkout (its src/gpt2dist) to "
                                                 "hold this one against")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()
    if (args.other / "src" / "gpt2dist").is_dir():
        ways = {"this": (sys.executable, REPO / "src"), "other": (sys.executable, args.other / "src")}
    elif (args.other / "bin" / "python").is_file():
        ways = {"this": (sys.executable, REPO / "src"), "other": (str(args.other / "bin" / "python"), REPO / "src")}
    else:
        parser.error(f"{args.other} is neither a venv (bin/python) nor a checkout (src/gpt2dist): name one")
    for way, (python, source) in ways.items():
        version = subprocess.run([python, "-c", "import sys, torch; print(sys.version.split()[0], torch.__version__)"],
                                 capture_output=True, text=True, check=True).stdout.strip()
        print(f"{way}: {Path(python).resolve()} (Python and torch {version}), gpt2dist from {source.resolve()}")
    data = random_shards(vocab=load_params(REPO / "params.yaml").preset("cpu")[1].model.vocab_size, tokens=200_000)
    measured: dict[str, dict[str, list[tuple[float, float]]]] = {}
    with LoadMonitor() as monitor:
        for round_ in range(args.rounds):
            for way in list(ways) if round_ % 2 == 0 else list(reversed(ways)):
                python, source = ways[way]
                for name, command in commands(python, data, args.steps).items():
                    measured.setdefault(name, {w: [] for w in ways})[way].append(seconds(command, data, source))
            print(f"  round {round_ + 1}/{args.rounds}", file=sys.stderr)
    for name, times in measured.items():
        for index, kind in enumerate(("wall s", "CPU-s")):
            this, other = ([t[index] for t in times[way]] for way in ("this", "other"))
            ratio, low, high, pairs = ratio_interval(this, other)
            print(f"{name}, {kind}: this {median(this):.2f}, other {median(other):.2f} (medians); this / other = "
                  f"{ratio:.3f} (95% interval {low:.3f} to {high:.3f}, {pairs} interleaved rounds)")
    print(machine_line(monitor))
    shutil.rmtree(data)


if __name__ == "__main__":
    main()
