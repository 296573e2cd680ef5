"""`gpt2dist plot`: the study's figures, each one function of the collected tables.

Every figure shares one seaborn theme, says its units on the axes and its hardware and
preset in the title (its lines wrapped to the figure's width, whatever the hardware is called), and is written
as PNG and SVG, at most 8 inches wide with its legend inside the canvas, so it reads at 800 pixels. A strategy
has one colour and marker in every figure, a precision one line style. Per-configuration bars run across, one row each, grouped by placement
(processes, nodes, link) and ranked within it, fastest on top: the answer at a glance. Bars and error
bars show the same statistic as summary.csv (geometric mean over undisturbed repeats, 95% log-scale
interval); each run is drawn over its bar, disturbed runs as red crosses, so nothing left out of a
statistic is hidden. A value axis ends a quarter past the largest value drawn: an interval reaching further is
cut there with its end written beside it, so that one wide interval does not flatten the rest.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; no display needed
import matplotlib.colors as mcolors  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from gpt2dist.config.configuration import configuration_name  # noqa: E402
from gpt2dist.config.schema import PRECISIONS, STRATEGY_NAMES  # noqa: E402
from gpt2dist.config.split import COMPOSING, NONE, parse_split, strategy_order  # noqa: E402
from gpt2dist.config.placement import Kind, Placement  # noqa: E402
from gpt2dist.config.strategies import REFERENCE  # noqa: E402
from gpt2dist.errors import UsageError  # noqa: E402
from gpt2dist.io import atomic_open  # noqa: E402
from gpt2dist.pipeline.layout import LINK_FIGURE  # noqa: E402
from gpt2dist.results.summarise import in_study_order  # noqa: E402
from gpt2dist.results.findings import SAME_LOSS_TOLERANCE  # noqa: E402
from gpt2dist.inputs import read_csv, read_summary  # noqa: E402
from gpt2dist.forecast.link_model import predicted_vs_measured  # noqa: E402
from gpt2dist.results.time_ledger import LEDGER, PART_WORDS, ledger_columns  # noqa: E402

EXACT_FLOOR = 1e-9  # where the deviation figure draws an exact match (a log axis has no zero)
# A value axis ends this far past the largest value drawn; an interval that reaches further is cut at the end
# with its end written there: one configuration's two disagreeing repeats (an interval from 2,208 to 48,414
# tokens/s in a study on 2 cores) otherwise set the scale and flattened every other bar and line.
AXIS_ROOM = 1.25
WIDTH = 8.0  # inches: 1200 pixels at the DPI written, so a figure shown 800 pixels wide keeps 2/3 of its type
DPI = 150
MARKERS = "osD^vPX*hpd<>"  # in the registry's order; one more than the colours, so (colour, marker) pairs differ
NPROC_LINES = {1: "-", 2: "--", 4: ":", 8: "-."}  # processes, where the precision is the panel
LINES = {"fp32": "-", "tf32": ":", "bf16": "--", "fp16": "-.", "apex-O1": (0, (3, 1, 1, 1, 1, 1)),
         "apex-O2": (0, (6, 2))}


# Precision by hatch on bars (colour is the strategy's): plain fp32, denser for the 16-bit kinds
HATCHES = {"fp32": "", "tf32": "..", "bf16": "///", "fp16": "\\\\\\", "apex-O1": "xx", "apex-O2": "++"}
# The colourblind palette, its second pink (too near fsdp's) swapped for its sky blue, its pale yellow for olive
# for three more strategies than the papers' nine: indigo, near-black and teal
STRATEGY_COLOURS = ("#0173b2", "#de8f05", "#029e73", "#d55e00", "#cc78bc", "#ca9161", "#56b4e9", "#949494",
                    "#8c8c00", "#5d3a9b", "#1a1a1a", "#006d6f")


# A ledger's parts as shades of the row's strategy colour (mixed with white by the fraction) and hatches, so that
# colour keeps meaning the strategy: compute full, communication under it pale, exposed communication hatched
LEDGER_LOOKS = {"compute_s": (0.0, None), "comm_hidden_s": (0.55, None), "comm_exposed_s": (0.0, "xxx"),
                "data_s": (0.3, "..."), "idle_s": (0.8, None)}


def _tint(colour: tuple, white: float) -> tuple:
    return tuple(c + (1 - c) * white for c in colour)


# For the splits that name their degrees (ddp-tp2-pp2): eleven colours of Trubetskoy's distinct set, away from the
# palette above, given in SPLIT_DEGREES' order (degrees, then method) so that the splits likeliest to meet in one
# study (ddp-tp2, fsdp-tp2, ddp-pp2, fsdp-pp2, tp2-pp2, ddp-tp2-pp2; paper-sizes' own) differ
SPLIT_COLOURS = ("#e6194b", "#911eb4", "#bfef45", "#f032e6", "#800000", "#000075", "#42d4f4", "#9a6324", "#3cb44b",
                 "#fabed4", "#ffe119")
SPLIT_DEGREES = [(2, 1), (1, 2), (2, 2), (4, 1), (1, 4), (4, 2), (2, 4), (8, 1), (1, 8), (4, 4), (8, 2), (2, 8)]
SPLIT_METHODS = (*COMPOSING, NONE)


class _Styles(dict):
    """The named strategies' styles, and a split's made when first asked for: its place in the splits' order
    (degrees, then method) picks its colour and marker, the same in every figure."""

    def __missing__(self, strategy: str) -> dict:
        try:
            split = parse_split(strategy)
            index = SPLIT_DEGREES.index((split.tp, split.pp)) * len(SPLIT_METHODS) + SPLIT_METHODS.index(split.method)
        except (UsageError, ValueError):  # an unlikely split: after the likely ones, by its name
            index = len(SPLIT_DEGREES) * len(SPLIT_METHODS) + zlib.crc32(strategy.encode()) % 97
        self[strategy] = {"color": mcolors.to_rgb(SPLIT_COLOURS[index % len(SPLIT_COLOURS)]),
                          "marker": MARKERS[index % len(MARKERS)]}
        return self[strategy]


def strategy_style() -> dict[str, dict]:
    """Each strategy's colour and marker, the same in every figure; past the palette, colours repeat with
    another marker, so any number of strategies is drawn. A split with degrees (ddp-tp2) takes a colour of a
    palette of its own by its method and degrees."""
    return _Styles({s: {"color": mcolors.to_rgb(STRATEGY_COLOURS[i % len(STRATEGY_COLOURS)]),
                        "marker": MARKERS[i % len(MARKERS)]} for i, s in enumerate(STRATEGY_NAMES)})


def drawn_strategies(data: pd.DataFrame) -> list[str]:
    """The strategies of `data` in the order of every table and figure."""
    return sorted(set(data["strategy"]), key=strategy_order)


def _strategy_bars(ax: plt.Axes, y: np.ndarray, data: pd.DataFrame, values, **kw):
    """Horizontal bars in their strategy's colour, hatched by precision."""
    style = strategy_style()
    bars = ax.barh(y, values, color=[style[s]["color"] for s in data["strategy"]], edgecolor="white", height=0.7,
                   **kw)
    for bar, precision in zip(bars, data["precision"]):
        bar.set_hatch(HATCHES[precision])
    return bars


def _bar_keys(data: pd.DataFrame) -> list:
    """Legend entries for _strategy_bars: each strategy drawn (its colour), then each precision (its hatch)."""
    style = strategy_style()
    drawn = drawn_strategies(data)
    return ([Patch(color=style[s]["color"], label=s) for s in drawn]
            + [Patch(facecolor="grey", edgecolor="white", hatch=HATCHES[p], label=p)
               for p in PRECISIONS if p in set(data["precision"])])


def _figure(height: float, **kw) -> tuple[plt.Figure, plt.Axes]:
    """A figure WIDTH wide whose layout makes room for everything drawn, legends outside the axes included."""
    return plt.subplots(figsize=(WIDTH, height), layout="constrained", **kw)


def _legend_below(fig: plt.Figure, handles: list, columns: int = 3) -> None:
    """The legend under the axes in at most `columns` columns, fewer where their labels would pass the figure's
    width (a GPU study's three precisions and its run markers did in six)."""
    if not handles:  # a figure with nothing drawn (a study without runs on one machine) has no legend
        return
    renderer = fig.canvas.get_renderer()
    for ncol in range(min(max(1, columns), len(handles)), 0, -1):
        legend = fig.legend(handles=handles, loc="outside lower center", ncol=ncol, fontsize="small", frameon=False)
        if ncol == 1 or legend.get_window_extent(renderer).width <= fig.bbox.width:
            return
        legend.remove()


def ranked(summary: pd.DataFrame, column: str, ascending: bool) -> pd.DataFrame:
    """Configurations grouped by placement (in study order) and ranked within it by `column`, the best first;
    configurations without a value last."""
    data = in_study_order(summary)
    data = data.assign(placement=[Placement.of(row).short_words() for row in data.to_dict("records")])
    groups = list(dict.fromkeys(data["placement"]))
    data = data.assign(_group=data["placement"].map(groups.index))
    ordered = data.sort_values(["_group", column], ascending=[True, ascending], na_position="last", kind="stable")
    return ordered.drop(columns="_group").reset_index(drop=True)


def _sized(frame: pd.DataFrame, *columns: str) -> list[str]:
    """Grouping columns, with the model size where the study trains sizes of its own (lines of two sizes never
    join)."""
    return [*columns, *(["size"] if "size" in frame else [])]


def _words(keys: tuple, *, nproc_at: int | None = None) -> str:
    """A legend label from grouping keys: 'ddp bf16', 'ddp bf16 medium', with 'n=2' for a process count."""
    return " ".join(f"n={key}" if i == nproc_at else str(key) for i, key in enumerate(keys))


def _row_label(row: dict) -> str:
    label = row.get("label")
    return (f"{label}: " if isinstance(label, str) and label else "") + configuration_name(row["strategy"], row["precision"])


def _rows(ax: plt.Axes, data: pd.DataFrame) -> np.ndarray:
    """One row per configuration, top to bottom, each placement headed by its name in a row of its own (so no
    label sits on the line between placements); returns the rows' y."""
    placements = data["placement"].tolist()
    starts = [i for i, p in enumerate(placements) if i == 0 or p != placements[i - 1]]
    y = np.array([i + 1 + sum(start <= i for start in starts[1:]) for i in range(len(data))], dtype=float)
    ax.set_yticks(y, [_row_label(row) for row in data.to_dict("records")], fontsize="small")
    if len(y):
        ax.set_ylim(y[-1] + 0.6, -0.6)  # top row first
    for start in starts:
        heading = y[start] - 1
        if start:
            ax.axhline(heading - 0.5, color="grey", linewidth=0.8)
        ax.text(0.005, heading, placements[start], transform=ax.get_yaxis_transform(), ha="left", va="center",
                fontsize="small", style="italic", weight="bold")
    ax.tick_params(axis="y", length=0)
    return y


def _rows_height(data: pd.DataFrame, extra: float) -> float:
    """Inches for _rows' rows and headings, plus `extra` for titles, axis and legend."""
    return 0.3 * (len(data) + data["placement"].nunique()) + extra


def _error(frame: pd.DataFrame, column: str, scale: float) -> np.ndarray:
    """Asymmetric error bar lengths from the summary's interval columns (0 where there is none)."""
    centre = frame[column] / scale
    low = (centre - frame[f"{column}_ci_low"] / scale).fillna(0).clip(lower=0)
    high = (frame[f"{column}_ci_high"] / scale - centre).fillna(0).clip(lower=0)
    return np.vstack([low, high])


def _axis_end(*drawn) -> float:
    """Where a value axis ends: AXIS_ROOM past the largest value drawn (means, runs, the ideal line), whatever the
    intervals reach."""
    values = np.concatenate([np.asarray(v, dtype=float).ravel() for v in drawn])
    largest = np.nanmax(values) if np.isfinite(values).any() else 1.0
    return AXIS_ROOM * largest if largest > 0 else 1.0


def _cut_at(positions, centres, error: np.ndarray, end: float, cuts: dict[float, list[float]]) -> np.ndarray:
    """`error` with every interval that reaches past `end` cut there, so one wide interval cannot set the scale
    of all the others; each cut interval's end is added to `cuts` at its position, for _write_cuts."""
    centres = np.asarray(centres, dtype=float)
    reach = centres + error[1]
    cut = error.copy()
    for i in np.flatnonzero(np.isfinite(reach) & (reach > end)):
        cut[1, i] = max(0.0, end - centres[i])
        cuts.setdefault(float(positions[i]), []).append(float(reach[i]))
    return cut


def _write_cuts(ax: plt.Axes, cuts: dict[float, list[float]], end: float, across: bool) -> None:
    """Beside each cut, an arrow and where the intervals cut there end (one label per position, however many
    intervals share it). `across`: values run along x."""
    for position, reaches in cuts.items():
        words = f"{'→' if across else '↑'} {', '.join(f'{r:,.3g}' for r in sorted(reaches))}"
        where = (end, position) if across else (position, end)
        ax.annotate(words, where, xytext=(-2, 2) if across else (2, -2), textcoords="offset points",
                    ha="right" if across else "left", va="bottom" if across else "top", fontsize="x-small")


def _config_bars(runs: pd.DataFrame, summary: pd.DataFrame, column: str, scale: float, xlabel: str, title: str,
                 best_is_high: bool) -> plt.Figure:
    data = ranked(summary, column, ascending=not best_is_high)
    fig, ax = _figure(_rows_height(data, 2.4))
    y = _rows(ax, data)
    centres, cuts = data[column] / scale, {}
    end = _axis_end(centres, runs.loc[runs["config_id"].isin(data["config_id"]), column] / scale)
    bars = _strategy_bars(ax, y, data, centres, xerr=_cut_at(y, centres, _error(data, column, scale), end, cuts),
                          capsize=3, ecolor="black")
    _write_cuts(ax, cuts, end, across=True)
    ax.set_xlim(0, end)
    for bar, from_disturbed in zip(bars, data["from_disturbed"]):
        if from_disturbed:
            bar.set(alpha=0.35, edgecolor="red")
    for i, config in enumerate(data["config_id"]):
        mine = runs[runs["config_id"] == config]
        quiet = mine["disturbed"].fillna("") == ""
        ax.scatter(mine.loc[quiet, column] / scale, np.full(quiet.sum(), y[i]), color="black", s=10, zorder=3)
        ax.scatter(mine.loc[~quiet, column] / scale, np.full((~quiet).sum(), y[i]), color="red", marker="x", s=30,
                   zorder=3)
    handles = _bar_keys(data)
    handles += [Line2D([], [], color="black", marker="o", linestyle="", markersize=4, label="one run"),
                Line2D([], [], color="red", marker="x", linestyle="", label="disturbed run (left out)")]
    if data["from_disturbed"].any():
        handles.append(Patch(facecolor="grey", alpha=0.35, edgecolor="red", label="only disturbed runs"))
    _legend_below(fig, handles, columns=min(len(handles), 6))
    ax.set(xlabel=xlabel, title=title)
    return fig


def throughput(runs: pd.DataFrame, summary: pd.DataFrame, metrics: pd.DataFrame, title: str) -> plt.Figure:
    return _config_bars(runs, summary, "tokens_per_s", 1e3, "throughput (thousand tokens/s)",
                        f"Throughput, geometric mean and 95% interval, fastest first\n{title}", best_is_high=True)


STATE_PARTS = ("param_bytes", "grad_bytes", "optimizer_bytes")


def memory(runs, summary, metrics, title):
    """Left: the model state each rank holds (what sharding divides), which orders the rows; right: each peak
    above the study's lowest, the lowest written in the title. On CPUs the peak is the process's resident set,
    hundreds of MiB of runtime under a few MiB that differ: drawn from zero, the differences would not show."""
    data = ranked(summary.assign(_state=summary[list(STATE_PARTS)].sum(axis=1, min_count=1)), "_state",
                  ascending=True).drop(columns="_state")
    fig, (state, peak) = _figure(_rows_height(data, 2.6), ncols=2, sharey=True)
    y = _rows(state, data)
    left = np.zeros(len(data))
    handles = []
    greys = sns.color_palette("Greys", 4)[1:]  # shades, so the parts are not read as strategies
    for part, colour in zip(STATE_PARTS, greys):
        values = data[part].fillna(0).to_numpy() / 2**20
        state.barh(y, values, left=left, color=colour, height=0.7)
        handles.append(Patch(color=colour, label=part.removesuffix("_bytes") + " (model state)"))
        left += values
    state.set(xlabel="MiB per rank", title="Model state held per rank")
    peaks, cuts = data["peak_mem_bytes"] / 2**20, {}
    lowest = peaks.min()
    above = peaks - lowest
    end = _axis_end(above)
    _strategy_bars(peak, y, data, above, xerr=_cut_at(y, above, _error(data, "peak_mem_bytes", 2**20), end, cuts),
                   capsize=3)
    _write_cuts(peak, cuts, end, across=True)
    peak.set_xlim(0, end)
    handles += _bar_keys(data)
    peak.set(xlabel="MiB per process above the lowest peak",
             title=f"Peak above the lowest, {lowest:,.0f} MiB\n(CUDA allocated; resident set on CPU)")
    _legend_below(fig, handles)
    fig.suptitle(f"Memory, least model state per rank first\n{title}")
    return fig


def scaling(runs, summary, metrics, title):
    """Speedup over the baseline and scaling efficiency (speedup / processes) against processes on one machine,
    side by side; runs on emulated nodes are in the links figure, and those across a cluster's nodes (whose
    speedup is over one node) in the throughput figure and the ranking."""
    data = summary.dropna(subset=["speedup"])
    data = data.loc[[Placement.of(row).kind is Kind.ONE_MACHINE for row in data.to_dict("records")]]
    fig, (fast, efficient) = _figure(4.8, ncols=2, sharex=True)
    style = strategy_style()
    counts = sorted(summary["nproc"].unique())
    panels = ((fast, "speedup", float, "speedup over the baseline (x), paired by repeat"),
              (efficient, "scaling_efficiency", lambda n: 1.0, "efficiency (speedup / processes)"))
    for ax, column, ideal, label in panels:
        end, cuts = _axis_end(data[column], [ideal(n) for n in counts]), {}
        for keys, group in data.groupby(_sized(data, "strategy", "precision"), sort=False):
            strategy, precision = keys[:2]
            group = group.sort_values("nproc")
            error = _cut_at(group["nproc"].to_numpy(), group[column], _error(group, column, 1.0), end, cuts)
            ax.errorbar(group["nproc"], group[column], yerr=error, capsize=4,
                        linestyle=LINES.get(precision, "-"), label=_words(keys), **style[strategy])
        _write_cuts(ax, cuts, end, across=False)
        ax.plot(counts, [ideal(n) for n in counts], color="grey", linestyle=":", label="ideal")
        ax.set_ylim(0, end)
        ax.set(xlabel="processes (GPUs on CUDA machines)", ylabel=label, xticks=counts)
    fast.set_title("Speedup")
    efficient.set_title("Efficiency")
    keys = _line_keys(data) + [Line2D([], [], color="grey", linestyle=":", label="ideal")]
    _legend_below(fig, keys, columns=min(len(keys), 6))
    fig.suptitle(f"Scaling on one machine, 95% intervals\n{title}")
    return fig


def _line_keys(data: pd.DataFrame) -> list:
    """Legend entries for lines: each strategy drawn (its colour and marker), then each precision (its style)."""
    style = strategy_style()
    drawn = drawn_strategies(data)
    return ([Line2D([], [], label=s, **style[s]) for s in drawn]
            + [Line2D([], [], color="black", linestyle=LINES.get(p, "-"), label=p)
               for p in PRECISIONS if p in set(data["precision"])])


def deviation_from_single(metrics: pd.DataFrame) -> pd.DataFrame:
    """|loss - single's loss| / single's loss per step and repeat, against `single` at the same precision
    (fp32's where the study has no single run at that precision): the equivalence claim, made visible."""
    train = metrics.dropna(subset=["loss"])
    single = train[train["strategy"] == REFERENCE].set_index(_sized(train, "precision", "repeat", "step"))["loss"]
    rows = []
    for config, group in train[train["strategy"] != REFERENCE].groupby("config_id", sort=False):
        precision = group["precision"].iloc[0]
        reference = precision if precision in single.index.get_level_values(0) else "fp32"
        keys = pd.MultiIndex.from_arrays([[reference] * len(group), group["repeat"], group["step"],
                                          *([group["size"]] if "size" in group else [])])
        base = single.reindex(keys).to_numpy()
        rows.append(group.assign(reference=f"single {reference}",
                                 deviation=np.abs(group["loss"].to_numpy() - base) / np.abs(base)))
    return pd.concat(rows, ignore_index=True).dropna(subset=["deviation"]) if rows else pd.DataFrame()


def loss_deviation(runs, summary, metrics, title):
    """Per step, how far each strategy's training loss lies from single's, against the tolerance the findings
    judge 'the same loss' by; a configuration equal to single at every step is named at the floor, where its
    line would hide under the others'."""
    data = deviation_from_single(metrics)
    precisions = [p for p in PRECISIONS if p in set(data["precision"])] if len(data) else ["fp32"]
    columns = min(2, len(precisions))
    rows = -(-len(precisions) // columns)
    fig, axes = _figure(3.6 * rows + 2.2, nrows=rows, ncols=columns, squeeze=False, sharey=True)
    style, handles = strategy_style(), {}
    for ax, precision in zip(axes.flat, precisions):
        panel = data[data["precision"] == precision] if len(data) else data
        exact = []
        for keys, group in (panel.groupby(_sized(panel, "strategy", "nproc"), sort=False) if len(panel) else []):
            strategy, nproc = keys[:2]
            median = group.groupby("step")["deviation"].median()
            (line,) = ax.plot(median.index, median.clip(lower=EXACT_FLOOR).to_numpy(),
                              linestyle=NPROC_LINES.get(nproc, "-"), markersize=3, label=_words(keys, nproc_at=1),
                              **style[strategy])
            handles.setdefault(line.get_label(), line)
            if (median == 0).all():
                exact.append(line.get_label())
        ax.axhline(SAME_LOSS_TOLERANCE, color="grey", linestyle="-.", linewidth=1)
        ax.text(0.01, SAME_LOSS_TOLERANCE, f"{SAME_LOSS_TOLERANCE:.0%}: 'same loss' in the findings",
                transform=ax.get_yaxis_transform(), va="bottom", fontsize="x-small", color="dimgrey")
        ax.text(0.01, EXACT_FLOOR / 1.6, "equal to single's: " + (", ".join(exact) if exact else "none at every step"),
                transform=ax.get_yaxis_transform(), va="top", fontsize="x-small", color="dimgrey", wrap=True)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_yscale("log")
        ax.set_ylim(EXACT_FLOOR / 30, max(SAME_LOSS_TOLERANCE * 10, ax.get_ylim()[1]))  # room under the floor
        reference = panel["reference"].iloc[0] if len(panel) else f"{REFERENCE} {precision}"
        ax.set(xlabel="optimizer step", title=f"{precision}, against {reference}")
    for ax in list(axes.flat)[len(precisions):]:
        ax.set_axis_off()
    fig.supylabel(f"|loss - single's| / single's (equal drawn at {EXACT_FLOOR:g})", fontsize="small")
    _legend_below(fig, list(handles.values()), columns=4)
    fig.suptitle(f"Deviation from the single-process loss, median over repeats\n{title}")
    return fig


def process_widths(counts) -> dict[int, float]:
    """A line's width by its process count, thicker with more processes, so that runs of one strategy and
    precision at several counts are told apart without a legend entry each."""
    return {int(n): 0.8 + 1.2 * i for i, n in enumerate(sorted(counts))}


def loss_vs_time(runs, summary, metrics, title):
    """The first repeat's training loss against wall-clock time on one machine: a strategy's colour and marker, a precision's line
    style and a process count's width, each once in the legend; time on a log scale, since runs differ tenfold in
    it (bf16 is emulated on CPUs without it) and the fast ones would crowd the first seconds."""
    data = metrics.dropna(subset=["loss"])
    data = data[data["repeat"] == data["repeat"].min()]  # wall-clock axes differ between repeats
    # on one machine: a configuration's runs on several nodes would join its line (the links figure has those)
    kinds = {row["config_id"]: Placement.of(row).kind for row in data.drop_duplicates("config_id").to_dict("records")}
    data = data[data["config_id"].map(kinds) == Kind.ONE_MACHINE]
    fig, ax = _figure(5.6)
    style, widths = strategy_style(), process_widths(data["nproc"].unique())
    for keys, group in data.groupby(_sized(data, "strategy", "precision", "nproc"), sort=False):
        strategy, precision, nproc = keys[:3]
        ax.plot(group["elapsed_s"], group["loss"], linestyle=LINES.get(precision, "-"), linewidth=widths[int(nproc)],
                markersize=3, markevery=max(1, len(group) // 5), label=_words(keys, nproc_at=2), **style[strategy])
    if data.empty:  # a tune on nodes alone: the links figure has its runs
        ax.text(0.5, 0.5, "no run on one machine in this study", transform=ax.transAxes, ha="center")
    else:
        ax.set_xscale("log")
    ax.set(xlabel="wall-clock training time (s, log scale)", ylabel="training loss (nats/token)",
           title=f"Loss over time on one machine, first repeat\n{title}")
    keys = _line_keys(data) + [Line2D([], [], color="black", linewidth=width, label=f"{n} process{'es' * (n > 1)}")
                               for n, width in widths.items()]
    _legend_below(fig, keys, columns=min(len(keys), 6))
    return fig


def links(runs, summary, metrics, title):
    """Throughput against link bandwidth on emulated nodes, measured and predicted, and the time the link adds."""
    model = predicted_vs_measured(summary)
    rows = summary.set_index("config_id").loc[model["config_id"]].reset_index()
    fig, (rate, added) = _figure(5.6, ncols=2)
    style = strategy_style()
    keys = []
    for (strategy, precision), group in rows.groupby(["strategy", "precision"], sort=False):
        group = group.sort_values("link_mbit")
        mine = model.set_index("config_id").loc[group["config_id"]]
        colour = style[strategy]["color"]
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
    added.set(ylabel="s per step", title="Time the link adds per step\n(on the link minus on one machine)")
    _legend_below(fig, keys, columns=3)
    fig.suptitle(f"Link bandwidth (tc tbf; latency not emulated;\nthe nodes share the machine's cores)\n{title}")
    return fig


def time_ledger(runs, summary, metrics, title):
    """Each configuration's traced step stacked by where its time went; the parts sum to the step."""
    columns = ledger_columns(summary)
    data = summary.dropna(subset=columns, how="all") if columns else summary.iloc[0:0]
    if not columns or data.empty:
        fig, ax = _figure(3.0)
        ax.text(0.5, 0.5, "No run recorded a time ledger\n(made before gpt2dist traced steps, or train.ledger_steps: 0)",
                ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
        ax.set_title(f"Where a step's time goes\n{title}")
        return fig
    data = ranked(data.assign(_traced=data[columns].fillna(0).sum(axis=1)), "_traced", ascending=True)
    fig, ax = _figure(_rows_height(data, 2.6))
    y = _rows(ax, data)
    left = np.zeros(len(data))
    style, keys = strategy_style(), []
    for column in columns:
        part = column.removeprefix(LEDGER)
        tint, hatch = LEDGER_LOOKS[part]
        values = data[column].fillna(0).to_numpy() * 1e3
        ax.barh(y, values, left=left, color=[_tint(style[s]["color"], tint) for s in data["strategy"]], height=0.7,
                hatch=hatch, edgecolor="white")
        keys.append(Patch(facecolor=_tint(mcolors.to_rgb("dimgrey"), tint), hatch=hatch, edgecolor="white",
                          label=PART_WORDS[part]))
        left += values
    ax.set(xlabel="ms per traced step (median over repeats)",
           title=f"Where a step's time goes (torch.profiler), shortest step first\n{title}")
    _legend_below(fig, keys, columns=2)  # three columns of these words pass 8 in
    return fig


FIGURES: dict[str, Callable[..., plt.Figure]] = {
    "throughput": throughput, "scaling": scaling, "loss_deviation": loss_deviation, "loss_vs_time": loss_vs_time,
    "memory": memory, "time_ledger": time_ledger,
}


def use_theme() -> None:
    """The one look of every figure (and a fixed salt: the same SVG ids for the same figure)."""
    sns.set_theme(style="whitegrid", context="notebook", palette="colorblind",
                  rc={"axes.titlesize": "medium", "figure.titlesize": "medium", "svg.hashsalt": "gpt2dist"})


def fit_titles(fig: plt.Figure) -> plt.Figure:
    """`fig` with its titles (each axes' and the figure's) inside its width: wrapped at spaces by matplotlib, which
    its layout then makes room for. A title centred over axes that sit right of the figure's centre (labels on their
    left) has less room than the figure's width: a hardware line that fitted the figure ran past its right edge there.
    A title with a word wider than half the figure (a hardware name without spaces) is laid out and shrunk until it
    fits; only then, as a layout pass more moves everything by a hair and the same runs must draw the same bytes."""
    # Figure.suptitle keeps its Text there (matplotlib has no public getter of the Text, only of its string)
    titles = [text for text in (fig._suptitle, *(ax.title for ax in fig.axes)) if text is not None and text.get_text()]
    renderer = fig.canvas.get_renderer()
    for text in titles:
        text.set_wrap(True)
    widest = max((renderer.get_text_width_height_descent(word, text.get_fontproperties(), ismath=False)[0]
                  for text in titles for word in text.get_text().split()), default=0.0)
    for _ in range(3 if widest > fig.bbox.width / 2 else 0):  # each shrink moves the layout a little: measure again
        fig.draw_without_rendering()
        width = fig.bbox.width
        too_wide = [(text, box) for text in titles if (box := text.get_window_extent()).x0 < 0 or box.x1 > width]
        for text, box in too_wide:
            centre = (box.x0 + box.x1) / 2
            text.set_fontsize(text.get_fontsize() * 0.97 * 2 * min(centre, width - centre) / box.width)
    return fig


def draw(name: str, tables: list[pd.DataFrame], title: str) -> plt.Figure:
    """Figure `name` of the collected tables (runs, summary, metrics), as `gpt2dist plot` writes it."""
    return fit_titles({**FIGURES, LINK_FIGURE: links}[name](*tables, title))


def plot(results: Path) -> list[Path]:
    results = Path(results)
    info = read_summary(results)
    tables = [read_csv(results / name, "gpt2dist collect") for name in ("runs.csv", "summary.csv", "metrics.csv")]
    repeats = int(tables[1]["repeats"].max()) if len(tables[1]) else 0
    title = f"{info['hardware']}\npreset {info['preset']}, up to {repeats} repeats per configuration"
    use_theme()
    drawn = [*FIGURES, *([LINK_FIGURE] if len(predicted_vs_measured(tables[1])) else [])]
    written = []
    for name in drawn:
        fig = draw(name, tables, title)
        for ext in ("png", "svg"):
            path = results / "figures" / f"{name}.{ext}"
            with atomic_open(path, "wb") as handle:
                # no creation date: figures rebuilt from the same runs are the same bytes
                fig.savefig(handle, format=ext, dpi=DPI, metadata={"Date": None} if ext == "svg" else None)
            written.append(path)
            # the layout the PNG was drawn with, kept for the SVG: laid out again it took a quarter of the drawing's CPU
            fig.set_layout_engine("none")
        plt.close(fig)
    return written
