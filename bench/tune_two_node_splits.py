"""The tune against the study it shortcuts: `gpt2dist tune` asked the reference two-node splits question (preset
two-node-splits-cpu, 4 processes on 2 nodes emulated here with 200 Mbit/s links, among the five splits the study
measured), beside the stored study docs/reference/two-node-splits-cpu: is the tune's top tier the study's, and what
does it cost against the study's run time (17 min 15 s in Snakemake, selftests included; its runs alone 874 s from
the first launch to the last end, on the machine the study ran on).

    python bench/tune_two_node_splits.py [--budget 345s] [--every-split] [--out results/tune-two-node-splits]

The default budget is a third of the study's 17 min 15 s. Needs root (network namespaces). The tune's time is this
machine's; on a busy machine its runs are slower and its budget measures fewer of them (it says which).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from common import REPO

from gpt2dist.errors import OneLineArgumentParser

STUDY = REPO / "docs" / "reference" / "two-node-splits-cpu"
STUDY_S = 17 * 60 + 15  # the study in Snakemake (docs/gpus-and-clusters.md)
STUDY_RUNS_S = 874  # its runs, the first launch to the last end (their records)
SPLITS = "ddp,fsdp,ddp-tp2,fsdp-tp2,ddp-pp2"
PLACEMENT = "4 processes on 2 emulated nodes, 200 Mbit/s"


def top_tier(summary: dict) -> list[str]:
    group = next(group for group in summary["answer"] if group["placement"] == PLACEMENT)
    return [row["strategy"] for row in group["ranked"] if row.get("tier") == 1]


def main() -> None:
    parser = OneLineArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", default=f"{STUDY_S / 3:.0f}s", help="the tune's budget (default: a third of the "
                        "study's time)")
    parser.add_argument("--every-split", action="store_true", help="weigh every split of the cluster, not only the "
                        "study's five")
    parser.add_argument("--out", default="results/tune-two-node-splits", help="the tune's directory")
    args = parser.parse_args()
    among = [] if args.every_split else ["--among", SPLITS]
    started = time.monotonic()
    subprocess.run([sys.executable, "-m", "gpt2dist", "tune", "--preset", "two-node-splits-cpu", "--nproc", "4",
                    "--emulate-nodes", "2", "--link-mbit", "200", *among, "--budget", args.budget, "--out", args.out,
                    "--replace"], cwd=REPO, check=True)
    wall = time.monotonic() - started
    tuned = json.loads((REPO / args.out / "results" / "summary.json").read_text())
    study = json.loads((STUDY / "summary.json").read_text())
    print(f"top tier: tune {', '.join(top_tier(tuned))}; study {', '.join(top_tier(study))}: "
          f"{'the same' if top_tier(tuned) == top_tier(study) else 'not the same'}")
    print(f"time: the tune {wall:,.0f} s here against the study's {STUDY_S:,} s in Snakemake ({wall / STUDY_S:.2f}) and "
          f"its runs' {STUDY_RUNS_S:,} s ({wall / STUDY_RUNS_S:.2f}); the tune's answer: {args.out}/summary.md")


if __name__ == "__main__":
    main()
