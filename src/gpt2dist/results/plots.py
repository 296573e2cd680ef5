"""`gpt2dist plot`: the study's figures, each one function of the collected tables.

Every figure shares one seaborn theme, says its units on the axes and its hardware and
preset in the title, and is written as PNG and SVG. Bars and error bars show the same
statistic as summary.csv (geometric mean over undisturbed repeats, 95% log-scale interval);
each run is drawn over its bar, disturbed runs as red crosses, so nothing left out of a
statistic is hidden.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; no display needed
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from gpt2dist.config.schema import PRECISIONS  # noqa: E402
from gpt2dist.config.strategies import REFERENCE  # noqa: E402
from gpt2dist.io import atomic_open  # noqa: E402
from gpt2dist.pipeline.study import LINK_FIGURE  # noqa: E402
from gpt2dist.results.collect import in_study_order  # noqa: E402
from gpt2dist.results.inputs import read_csv, read_json  # noqa: E402
from gpt2dist.results.link_model import predicted_vs_measured  # noqa: E402
from gpt2dist.results.time_ledger import LEDGER, PART_WORDS, ledger_columns  # noqa: E402

EXACT_FLOOR = 1e-9  # where the deviation figure draws an exact match (a log axis has no zero)


def _colours() -> dict[str, tuple]:
    return dict(zip(PRECISIONS, sns.color_palette("colorblind", len(PRECISIONS))))


def _label(frame: pd.DataFrame) -> list[str]:
    """Strategy, precision and processes, under what the paper calls the configuration where it names one."""
    labels = frame["label"].fillna("") if "label" in frame else [""] * len(frame)  # an empty CSV cell reads as NaN
    nodes = frame["nodes"] if "nodes" in frame else [1] * len(frame)
    links = frame["link_mbit"] if "link_mbit" in frame else [np.nan] * len(frame)
    where = ["" if k == 1 else f"\n{k} nodes\n" + ("unshaped" if np.isnan(mbit) else f"{mbit:g} Mbit/s")
             for k, mbit in zip(nodes, links)]
    return [(f"{label}\n" if label else "") + f"{s}\n{p}\nn={n}{at}"
            for label, s, p, n, at in zip(labels, frame["strategy"], frame["precision"], frame["nproc"], where)]


def _error(frame: pd.DataFrame, column: str, scale: float) -> np.ndarray:
    """Asymmetric error bar lengths from the summary's interval columns (0 where there is none)."""
    centre = frame[column] / scale
    low = (centre - frame[f"{column}_ci_low"] / scale).fillna(0).clip(lower=0)
    high = (frame[f"{column}_ci_high"] / scale - centre).fillna(0).clip(lower=0)
    return np.vstack([low, high])


def _config_bars(runs: pd.DataFrame, summary: pd.DataFrame, column: str, scale: float, ylabel: str,
                 title: str) -> plt.Figure:
    data = in_study_order(summary)
    colours = _colours()
    x = np.arange(len(data))
    fig, ax = plt.subplots(figsize=(max(8, 0.9 * len(data) + 5), 5.2))
    bars = ax.bar(x, data[column] / scale, color=[colours[p] for p in data["precision"]],
                  yerr=_error(data, column, scale), capsize=4, ecolor="black")
    for bar, from_disturbed in zip(bars, data["from_disturbed"]):
        if from_disturbed:
            bar.set_hatch("//")
    for i, config in enumerate(data["config_id"]):
        mine = runs[runs["config_id"] == config]
        quiet = mine["disturbed"].fillna("") == ""
        ax.scatter(np.full(quiet.sum(), i), mine.loc[quiet, column] / scale, color="black", s=12, zorder=3)
        ax.scatter(np.full((~quiet).sum(), i), mine.loc[~quiet, column] / scale, color="red", marker="x", s=40,
                   zorder=3)
    handles = [Patch(color=colours[p], label=p) for p in data["precision"].unique()]
    handles += [Line2D([], [], color="black", marker="o", linestyle="", markersize=4, label="one run"),
                Line2D([], [], color="red", marker="x", linestyle="", label="disturbed run (left out)")]
    if data["from_disturbed"].any():
        handles.append(Patch(facecolor="white", edgecolor="black", hatch="//", label="only disturbed runs"))
    ax.legend(handles=handles, fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set_xticks(x, _label(data), fontsize="small")
    ax.set(xlabel="strategy, precision, processes", ylabel=ylabel, title=title)
    return fig


def throughput(runs: pd.DataFrame, summary: pd.DataFrame, metrics: pd.DataFrame, title: str) -> plt.Figure:
    return _config_bars(runs, summary, "tokens_per_s", 1e3, "throughput (thousand tokens/s)",
                        f"Throughput, geometric mean and 95% interval\n{title}")


def epoch_time(runs, summary, metrics, title):
    return _config_bars(runs, summary, "time_per_epoch_s", 60, "time per epoch (min)", f"Time per epoch\n{title}")


def memory(runs, summary, metrics, title):
    """Left: the model state each rank holds (what sharding divides); right: the process's peak."""
    data = in_study_order(summary)
    x = np.arange(len(data))
    fig, (state, peak) = plt.subplots(2, 1, figsize=(max(8, 0.9 * len(data) + 4), 9))
    bottom = np.zeros(len(data))
    for part, colour in zip(("param_bytes", "grad_bytes", "optimizer_bytes"), sns.color_palette("colorblind", 3)):
        values = data[part].fillna(0).to_numpy() / 2**20
        state.bar(x, values, bottom=bottom, color=colour, label=part.removesuffix("_bytes"))
        bottom += values
    state.set_xticks(x, _label(data), fontsize="small")
    state.set(ylabel="MiB per rank", title="Model state held per rank")
    state.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    colours = _colours()
    peak.bar(x, data["peak_mem_bytes"] / 2**20, color=[colours[p] for p in data["precision"]],
             yerr=_error(data, "peak_mem_bytes", 2**20), capsize=4)
    peak.set_xticks(x, _label(data), fontsize="small")
    peak.set(ylabel="MiB per process", title="Peak memory (CUDA allocated; resident set on CPU)")
    fig.suptitle(f"Memory\n{title}")
    return fig


def _scaling(summary: pd.DataFrame, column: str, ideal: Callable, ylabel: str, title: str) -> plt.Figure:
    """Against processes on one machine; runs on emulated nodes are in the links figure."""
    data = summary.dropna(subset=[column])
    if "nodes" in data:
        data = data[data["nodes"] == 1]
    fig, ax = plt.subplots(figsize=(7, 4.8))
    for (strategy, precision), group in data.groupby(["strategy", "precision"], sort=False):
        group = group.sort_values("nproc")
        ax.errorbar(group["nproc"], group[column], yerr=_error(group, column, 1.0), marker="o", capsize=4,
                    label=f"{strategy} {precision}")
    counts = sorted(summary["nproc"].unique())
    ax.plot(counts, [ideal(n) for n in counts], color="grey", linestyle=":", label="ideal")
    ax.set(xlabel="processes (GPUs on CUDA machines)", ylabel=ylabel, title=title, xticks=counts)
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return fig


def speedup(runs, summary, metrics, title):
    return _scaling(summary, "speedup", float, "speedup over the baseline (x), paired by repeat",
                    f"Speedup\n{title}")


def efficiency(runs, summary, metrics, title):
    return _scaling(summary, "scaling_efficiency", lambda n: 1.0, "scaling efficiency", f"Scaling efficiency\n{title}")


def deviation_from_single(metrics: pd.DataFrame) -> pd.DataFrame:
    """|loss - single's loss| / single's loss per step and repeat, against `single` at the same precision
    (fp32's where the study has no single run at that precision): the equivalence claim, made visible."""
    train = metrics.dropna(subset=["loss"])
    single = train[train["strategy"] == REFERENCE].set_index(["precision", "repeat", "step"])["loss"]
    rows = []
    for config, group in train[train["strategy"] != REFERENCE].groupby("config_id", sort=False):
        precision = group["precision"].iloc[0]
        reference = precision if precision in single.index.get_level_values(0) else "fp32"
        keys = pd.MultiIndex.from_arrays([[reference] * len(group), group["repeat"], group["step"]])
        base = single.reindex(keys).to_numpy()
        rows.append(group.assign(reference=f"single {reference}",
                                 deviation=np.abs(group["loss"].to_numpy() - base) / np.abs(base)))
    return pd.concat(rows, ignore_index=True).dropna(subset=["deviation"]) if rows else pd.DataFrame()


def loss_deviation(runs, summary, metrics, title):
    data = deviation_from_single(metrics)
    precisions = list(data["precision"].unique()) if len(data) else ["fp32"]
    fig, axes = plt.subplots(1, len(precisions), figsize=(5.5 * len(precisions) + 1.5, 5.5), squeeze=False,
                             sharey=True)
    for ax, precision in zip(axes[0], precisions):
        panel = data[data["precision"] == precision] if len(data) else data
        if len(panel):
            panel = panel.assign(deviation=panel["deviation"].clip(lower=EXACT_FLOOR),
                                 configuration=panel["strategy"] + " n=" + panel["nproc"].astype(str))
            sns.lineplot(data=panel, x="step", y="deviation", hue="configuration", estimator="median",
                         errorbar=None, marker="o", markersize=3, ax=ax)
            # below the axes: curves at the floor would hide under a legend drawn inside
            ax.legend(fontsize="x-small", loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=3)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_yscale("log")
        reference = panel["reference"].iloc[0] if len(panel) else REFERENCE
        ax.set(xlabel="optimizer step", ylabel=f"|loss - {reference}| / {reference}",
               title=f"{precision} (exact matches at {EXACT_FLOOR:g})")
    fig.suptitle(f"Deviation from the single-process loss, median over repeats\n{title}")
    return fig


def loss_vs_time(runs, summary, metrics, title):
    data = metrics.dropna(subset=["loss"])
    data = data[data["repeat"] == data["repeat"].min()]  # wall-clock axes differ between repeats
    data = data.assign(configuration=data["strategy"] + " " + data["precision"] + " n=" + data["nproc"].astype(str))
    fig, ax = plt.subplots(figsize=(8, 4.8))
    sns.lineplot(data=data, x="elapsed_s", y="loss", hue="configuration", style="strategy", errorbar=None, ax=ax)
    ax.set(xlabel="wall-clock training time (s)", ylabel="training loss (nats/token)",
           title=f"Loss over time, first repeat\n{title}")
    ax.legend(fontsize="x-small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return fig


def links(runs, summary, metrics, title):
    """Throughput against link bandwidth on emulated nodes, measured and predicted, and the time the link adds."""
    model = predicted_vs_measured(summary)
    rows = summary.set_index("config_id").loc[model["config_id"]].reset_index()
    fig, (rate, added) = plt.subplots(1, 2, figsize=(13, 5.2))
    palette = dict(zip(model["strategy"].unique(), sns.color_palette("colorblind")))
    keys = []
    for (strategy, precision), group in rows.groupby(["strategy", "precision"], sort=False):
        group = group.sort_values("link_mbit")
        mine = model.set_index("config_id").loc[group["config_id"]]
        colour = palette[strategy]
        keys.append(Patch(color=colour, label=f"{strategy} {precision} n={group['nproc'].iloc[0]}"))
        rate.errorbar(group["link_mbit"], group["tokens_per_s"], yerr=_error(group, "tokens_per_s", 1.0), marker="o",
                      capsize=4, color=colour)
        tokens_per_step = group["tokens_per_s"].to_numpy() * group["step_time_s"].to_numpy()
        rate.plot(group["link_mbit"], tokens_per_step / mine["predicted_step_time_s"].to_numpy(), linestyle="--",
                  color=colour)
        rate.axhline(tokens_per_step.mean() / mine["one_machine_step_time_s"].iloc[0], linestyle=":", color=colour)
        added.plot(mine["link_mbit"], mine["measured_link_s"].clip(lower=1e-4), marker="o", linestyle="none",
                   color=colour)
        added.plot(mine["link_mbit"], mine["modelled_link_s"], linestyle="--", color=colour)
    keys += [Line2D([], [], color="black", marker="o", linestyle="none", label="measured (95% interval)"),
             Line2D([], [], color="black", linestyle="--", label="link model"),
             Line2D([], [], color="black", linestyle=":", label="on one machine")]
    rates = sorted(model["link_mbit"].unique())
    for ax in (rate, added):
        ax.set_xscale("log")
        ax.set_xticks(rates, [f"{r:g}" for r in rates])
        ax.minorticks_off()
        ax.set_xlabel("each node's link, Mbit/s each way")
    added.set_yscale("log")
    rate.set(ylabel="tokens/s", title="Throughput on 2 emulated nodes")
    added.set(ylabel="s per step", title="Time the link adds per step\n(step on the link minus step on one machine)")
    added.legend(handles=keys, fontsize="x-small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.suptitle(f"Link bandwidth (tc tbf; latency not emulated; the nodes share the machine's cores)\n{title}")
    return fig


def time_ledger(runs, summary, metrics, title):
    """Each configuration's traced step stacked by where its time went; the parts sum to the step."""
    data = in_study_order(summary)
    columns = ledger_columns(data)
    if columns:
        data = data.dropna(subset=columns, how="all")
    fig, ax = plt.subplots(figsize=(max(8, 0.9 * max(len(data), 1) + 5), 5.2))
    if not columns or data.empty:
        ax.text(0.5, 0.5, "No run recorded a time ledger\n(made before gpt2dist traced steps, or train.ledger_steps: 0)",
                ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
        ax.set_title(f"Where a step's time goes\n{title}")
        return fig
    x = np.arange(len(data))
    bottom = np.zeros(len(data))
    colours = sns.color_palette("colorblind", 10)  # compute blue, hidden under it light blue, exposed red, idle grey
    palette = dict(zip(PART_WORDS, (colours[0], colours[9], colours[3], colours[8], colours[7])))
    for column in columns:
        part = column.removeprefix(LEDGER)
        values = data[column].fillna(0).to_numpy() * 1e3
        ax.bar(x, values, bottom=bottom, color=palette[part], label=PART_WORDS[part],
               hatch="//" if part == "comm_exposed_s" else None, edgecolor="white")
        bottom += values
    ax.set_xticks(x, _label(data), fontsize="small")
    ax.set(xlabel="strategy, precision, processes", ylabel="ms per traced step (median over repeats)",
           title=f"Where a step's time goes (torch.profiler)\n{title}")
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return fig


FIGURES: dict[str, Callable[..., plt.Figure]] = {
    "throughput": throughput, "speedup": speedup, "efficiency": efficiency, "loss_deviation": loss_deviation,
    "loss_vs_time": loss_vs_time, "memory": memory, "epoch_time": epoch_time, "time_ledger": time_ledger,
}


def plot(results: Path) -> list[Path]:
    results = Path(results)
    info = read_json(results / "summary.json", "gpt2dist collect")
    tables = [read_csv(results / name, "gpt2dist collect") for name in ("runs.csv", "summary.csv", "metrics.csv")]
    repeats = int(tables[1]["repeats"].max()) if len(tables[1]) else 0
    title = f"{info['hardware']}\npreset {info['preset']}, up to {repeats} repeats per configuration"
    sns.set_theme(style="whitegrid", context="notebook", palette="colorblind",
                  rc={"axes.titlesize": "medium", "figure.titlesize": "medium"})
    drawn = dict(FIGURES)
    if len(predicted_vs_measured(tables[1])):
        drawn[LINK_FIGURE] = links
    written = []
    for name, figure in drawn.items():
        fig = figure(*tables, title)
        fig.tight_layout()
        for ext in ("png", "svg"):
            path = results / "figures" / f"{name}.{ext}"
            with atomic_open(path, "wb") as handle:
                fig.savefig(handle, format=ext, dpi=150)
            written.append(path)
        plt.close(fig)
    return written
