"""`gpt2dist report`: results/summary.md, the study's comparison table regenerated from
summary.json, with the environment it was measured in."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
from tabulate import tabulate

from gpt2dist.io import atomic_write_text
from gpt2dist.pipeline.study import FIGURES
from gpt2dist.results.collect import in_study_order
from gpt2dist.results.inputs import read_json


def _num(value, fmt: str) -> str:
    return "n/a" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, fmt)


def _with_ci(row: dict, key: str, fmt: str, scale: float = 1.0) -> str:
    low, high = row.get(f"{key}_ci_low"), row.get(f"{key}_ci_high")
    middle = _num(row[key] / scale, fmt)
    if low is None or high is None:
        return middle
    return f"{middle} ({_num(low / scale, fmt)} to {_num(high / scale, fmt)})"


def summary_markdown(summary: dict) -> str:
    rows = [
        [row["strategy"], row["precision"], row["nproc"], row["repeats"],
         _with_ci(row, "tokens_per_s", ",.0f"), _num(row.get("speedup"), ".2f"),
         _num(row.get("scaling_efficiency"), ".2f"), _num(row["peak_mem_bytes"] / 2**20, ",.0f"),
         _num(row.get("final_val_loss"), ".3f"), _num(row.get("mfu"), ".1%")]
        for row in in_study_order(pd.DataFrame(summary["configs"].values())).to_dict("records")
    ]
    table = tabulate(rows, headers=["strategy", "precision", "processes", "repeats",
                                    "tokens/s, median (95% CI)", "speedup", "efficiency", "peak MiB", "final val loss",
                                    "MFU"], tablefmt="github")
    versions = ", ".join(f"{k} {v}" for k, v in summary["versions"].items() if v)
    dropped = ", ".join(summary["dropped_configurations"]) or "none"
    figures = "\n".join(f"![{name}](figures/{name}.png)" for name in FIGURES)
    return f"""# gpt2dist results: preset `{summary['preset']}`

Hardware: {summary['hardware']}. Software: {versions}.
Throughput is each run's median after {summary['warmup_steps']} warm-up steps; the table gives the median
over repeats and a 95% t-interval of their mean. Speedup is over the one-process run of the same
precision (`single`'s, else the strategy's own; "n/a" where the study has none); efficiency is
speedup / processes. Configurations dropped for lack of GPUs: {dropped}.

{table}

{figures}
"""


def report(results: Path) -> Path:
    results = Path(results)
    path = results / "summary.md"
    atomic_write_text(path, summary_markdown(read_json(results / "summary.json", "gpt2dist collect")))
    return path
