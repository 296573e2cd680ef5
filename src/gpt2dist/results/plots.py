"""`gpt2dist plot`: the study's figures, each one function of the collected tables.

Every figure shares one seaborn theme, says its units on the axes and its hardware and
preset in the title, and is written as PNG and SVG.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; no display needed
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

from gpt2dist.io import atomic_open  # noqa: E402
from gpt2dist.results.collect import in_study_order, t_interval  # noqa: E402
from gpt2dist.results.inputs import read_csv, read_json  # noqa: E402


def _label(frame: pd.DataFrame) -> pd.Series:
    return frame["strategy"] + "\nn=" + frame["nproc"].astype(str)


def _bars(runs: pd.DataFrame, column: str, scale: float, ylabel: str, title: str) -> plt.Figure:
    data = in_study_order(runs)
    data = data.assign(config=_label(data), value=data[column] / scale)
    fig, ax = plt.subplots(figsize=(max(6, 0.7 * data["config"].nunique() + 3), 4.5))
    sns.barplot(data=data, x="config", y="value", hue="precision", estimator="median", order=data["config"].unique(),
                errorbar=lambda v: t_interval(pd.Series(v)), capsize=0.15, ax=ax)
    ax.set(xlabel="strategy, processes", ylabel=ylabel, title=title)
    return fig


def throughput(runs: pd.DataFrame, summary: pd.DataFrame, metrics: pd.DataFrame, title: str) -> plt.Figure:
    return _bars(runs, "tokens_per_s", 1e3, "throughput (thousand tokens/s)", f"Throughput: {title}")


def memory(runs, summary, metrics, title):
    return _bars(runs, "peak_mem_bytes", 2**20, "peak memory (MiB)", f"Peak memory per process: {title}")


def epoch_time(runs, summary, metrics, title):
    return _bars(runs, "time_per_epoch_s", 60, "time per epoch (min)", f"Time per epoch: {title}")


def _scaling(summary: pd.DataFrame, column: str, ideal: Callable, ylabel: str, title: str) -> plt.Figure:
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    sns.lineplot(data=summary, x="nproc", y=column, hue="strategy", style="precision", markers=True, ax=ax)
    counts = sorted(summary["nproc"].unique())
    ax.plot(counts, [ideal(n) for n in counts], color="grey", linestyle=":", label="ideal")
    ax.set(xlabel="processes (GPUs on CUDA machines)", ylabel=ylabel, title=title, xticks=counts)
    ax.legend(fontsize="small")
    return fig


def speedup(runs, summary, metrics, title):
    return _scaling(summary, "speedup", float, "speedup over single (x)", f"Speedup: {title}")


def efficiency(runs, summary, metrics, title):
    return _scaling(summary, "scaling_efficiency", lambda n: 1.0, "scaling efficiency", f"Scaling efficiency: {title}")


def _curves(metrics: pd.DataFrame, x: str, xlabel: str, title: str, *, first_repeat: bool) -> plt.Figure:
    data = metrics.dropna(subset=["loss"])
    if first_repeat:  # wall-clock axes differ between repeats, so they cannot be averaged
        data = data[data["repeat"] == data["repeat"].min()]
    data = data.assign(configuration=data["strategy"] + " " + data["precision"] + " n=" + data["nproc"].astype(str))
    fig, ax = plt.subplots(figsize=(7, 4.5))
    sns.lineplot(data=data, x=x, y="loss", hue="configuration", style="strategy",
                 errorbar=None if first_repeat else ("ci", 95), ax=ax)
    ax.set(xlabel=xlabel, ylabel="training loss (nats/token)", title=title)
    ax.legend(fontsize="x-small", ncol=2)
    return fig


def loss_vs_step(runs, summary, metrics, title):
    return _curves(metrics, "step", "optimizer step", f"Loss per step (the equivalence picture): {title}",
                   first_repeat=False)


def loss_vs_time(runs, summary, metrics, title):
    return _curves(metrics, "elapsed_s", "wall-clock training time (s)", f"Loss over time, first repeat: {title}",
                   first_repeat=True)


FIGURES: dict[str, Callable[..., plt.Figure]] = {
    "throughput": throughput, "speedup": speedup, "efficiency": efficiency, "loss_vs_step": loss_vs_step,
    "loss_vs_time": loss_vs_time, "memory": memory, "epoch_time": epoch_time,
}


def plot(results: Path) -> list[Path]:
    results = Path(results)
    info = read_json(results / "summary.json", "gpt2dist collect")
    tables = [read_csv(results / name, "gpt2dist collect") for name in ("runs.csv", "summary.csv", "metrics.csv")]
    title = f"{info['hardware']}, preset {info['preset']}"
    sns.set_theme(style="whitegrid", context="notebook", palette="colorblind")
    written = []
    for name, figure in FIGURES.items():
        fig = figure(*tables, title)
        fig.tight_layout()
        for ext in ("png", "svg"):
            path = results / "figures" / f"{name}.{ext}"
            with atomic_open(path, "wb") as handle:
                fig.savefig(handle, format=ext, dpi=150)
            written.append(path)
        plt.close(fig)
    return written
