"""The figures read at a glance, checked on the two reference studies rebuilt from their bundles (and the H200's
study as it came back): at most
WIDTH inches wide, every piece of text on the canvas and legible, every configuration on the bar figures,
ranked best first within its placement, and strategies told apart by colour and marker together. Each check
has a figure beside it that breaks it."""

from __future__ import annotations

import tarfile

import matplotlib.colors as mcolors
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
from matplotlib.collections import PathCollection
from matplotlib.container import BarContainer
from matplotlib.text import Text

from gpt2dist.config.machine import SPEED_FLAGS
from gpt2dist.pipeline.layout import FIGURES as FIGURE_NAMES, LINK_FIGURE
from gpt2dist.results.findings import SAME_LOSS_TOLERANCE
from gpt2dist.results.per_run import hardware_label
from gpt2dist.results.plots import AXIS_ROOM, EXACT_FLOOR, FIGURES, WIDTH, draw, ranked, strategy_style, use_theme
from gpt2dist.system.hardware import GPUS

from conftest import REPO

MIN_POINTS = 8  # 8 pt at 150 dpi is 11 px on a figure shown 800 px wide


def longest_hardware_lines() -> dict[str, str]:
    """The hardware lines of the longest CPU and GPU descriptions the project writes (results.per_run's
    hardware_label): a CPU with every instruction set it names, emulated bf16 and a 3-digit core count; eight of the
    longest-named GPU of its datasheets over NVLink. And a name without spaces, which no wrapping can break."""
    cpu = {"devices": {"cpu": "Intel(R) Xeon(R) Platinum 8592+ 64-Core Processor", "cpu_cores": 128,
                       "cpu_bf16": "emulated", "cpu_identity": {"family": "6", "model": "207", "mhz": 3900,
                                                                "speed_flags": list(SPEED_FLAGS.values())}},
           "precision": "bf16"}
    gpu_name = f"NVIDIA {max(GPUS, key=len)}"
    gpu = {"devices": {"cpu": "unused", "gpus": [gpu_name] * 8, "gpu_memory_gib": [79.6], "driver": "580.105.08",
                       "power_limit_w": 700.0, "topology": "GPU0 X NV18"},
           "node_hardware": [{"devices": {gpu_name: 8}}]}
    return {"cpu": hardware_label({"r": cpu})[0], "gpu": hardware_label({"r": gpu})[0],
            "one word": "AMD-EPYC-" + "x" * 150}


@pytest.fixture(scope="module", params=["cpu-study", pytest.param("two-node-cpu", marks=pytest.mark.slow)])  # its rebuild
def study(request, reference_study) -> tuple[list[pd.DataFrame], str]:
    out = reference_study(request.param)
    use_theme()  # as `gpt2dist plot` draws them
    tables = [pd.read_csv(out / name) for name in ("runs.csv", "summary.csv", "metrics.csv")]
    return tables, f"{longest_hardware_lines()['cpu']}\npreset {request.param}"  # the longest a CPU study writes


def drawn_text(fig: plt.Figure) -> list[Text]:
    fig.canvas.draw()
    return [t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip() and t.figure is fig]


def off_canvas(fig: plt.Figure) -> list[str]:
    """Nothing when all that is drawn lies on the canvas (matplotlib's tight box of the drawn artists); else
    the pieces of text that reach past its edges (by more than a pixel)."""
    texts, renderer = drawn_text(fig), fig.canvas.get_renderer()
    drawn, (width, height) = fig.get_tightbbox(renderer), fig.get_size_inches()
    if drawn.x0 > -0.01 and drawn.y0 > -0.01 and drawn.x1 < width + 0.01 and drawn.y1 < height + 0.01:
        return []
    pixels_wide, pixels_high = fig.canvas.get_width_height()
    return [text.get_text() for text in texts if (box := text.get_window_extent(renderer)).x0 < -1 or box.y0 < -1
            or box.x1 > pixels_wide + 1 or box.y1 > pixels_high + 1]


def figures_of(study) -> dict[str, plt.Figure]:
    """Every figure of the study, as `gpt2dist plot` draws it."""
    tables, title = study
    links = tables[1]["link_mbit"].notna().any() if "link_mbit" in tables[1] else False
    return {name: draw(name, tables, title) for name in (*FIGURE_NAMES, *([LINK_FIGURE] if links else []))}


def test_every_figure_fits_its_width_and_keeps_its_text_on_the_canvas(study):
    for name, fig in figures_of(study).items():
        assert fig.get_size_inches()[0] <= WIDTH, name
        assert off_canvas(fig) == [], name
        smallest = min(t.get_fontsize() for t in drawn_text(fig))
        assert smallest >= MIN_POINTS, (name, smallest)
        plt.close(fig)


def test_a_gpu_studys_figures_keep_their_legends_on_the_canvas():
    """The H200's one-GPU study (three precisions, eight strategies' keys and the run markers) drew its throughput
    legend in six columns past the figure's right edge; the legend now takes fewer columns where its labels need
    them. The control: the same figure with its legend in six columns again reaches past the edge."""
    stored = REPO / "docs" / "reference" / "h200-1gpu"
    with tarfile.open(stored / "records.tar.gz") as records:
        metrics = pd.read_csv(records.extractfile("results/metrics.csv"))
    use_theme()
    tables = [pd.read_csv(stored / "runs.csv"), pd.read_csv(stored / "summary.csv"), metrics]
    title = f"{longest_hardware_lines()['gpu']}\npreset gpu-1gpu"
    for name in FIGURE_NAMES:
        fig = draw(name, tables, title)
        assert fig.get_size_inches()[0] <= WIDTH and off_canvas(fig) == [], name
        if name == "throughput":
            legend = fig.legends[0]
            handles = legend.legend_handles
            legend.remove()
            fig.legend(handles=handles, loc="outside lower center", ncol=6, fontsize="small", frameon=False)
            assert off_canvas(fig), "six columns fit: the control shows nothing"
        plt.close(fig)


def test_off_canvas_finds_a_legend_beside_the_axes_and_a_title_too_long():
    fig, ax = plt.subplots(figsize=(WIDTH, 4))  # control: the old figures' legend, beside the axes, no layout
    ax.plot([0, 1], [0, 1], label="a configuration with a long name")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0))
    assert "a configuration with a long name" in off_canvas(fig)
    ax.get_legend().remove()
    assert off_canvas(fig) == []
    ax.set_title("a title " * 30)
    assert "a title " * 30 in off_canvas(fig)
    plt.close(fig)


@pytest.mark.parametrize("kind", ["gpu", pytest.param("one word", marks=pytest.mark.slow)])  # the cpu's: above
def test_every_title_fits_the_figure_whatever_the_hardware_is_called(kind, study):
    """The hardware line wraps at spaces, at a legible size (test_every_figure_fits_its_width_and_keeps_its_text_on_
    the_canvas draws the longest CPU line); a name without spaces shrinks until it fits."""
    tables, title = study
    hardware = longest_hardware_lines()[kind]
    for name in FIGURE_NAMES:
        fig = draw(name, tables, title.replace(longest_hardware_lines()["cpu"], hardware))
        assert off_canvas(fig) == [], (name, hardware)
        if kind != "one word":
            assert min(t.get_fontsize() for t in drawn_text(fig)) >= MIN_POINTS, name
        plt.close(fig)
    # control: drawn as before titles were fitted, the longest CPU line runs past the figure's right edge
    fig = FIGURES["throughput"](*tables, title)
    assert any(longest_hardware_lines()["cpu"] in text for text in off_canvas(fig))
    plt.close(fig)


def _rows(fig: plt.Figure) -> list[str]:
    return [label.get_text() for label in fig.axes[0].get_yticklabels()]


def test_the_throughput_bars_have_a_row_per_configuration_best_first(study):
    tables, title = study
    summary, column, best_is_high = tables[1], "tokens_per_s", True
    fig = FIGURES["throughput"](*tables, title)
    assert sorted(_rows(fig)) == sorted(f"{s} {p}" for s, p in zip(summary["strategy"], summary["precision"]))
    order = ranked(summary, column, ascending=not best_is_high)
    for _, group in order.groupby("placement", sort=False):
        values = group[column].dropna().to_list()
        assert values == sorted(values, reverse=best_is_high), group[["config_id", column]]
    assert _rows(fig) == [f"{s} {p}" for s, p in zip(order["strategy"], order["precision"])]  # drawn in that order
    headings = [t.get_text() for t in fig.axes[0].texts if t.get_text()[:1] != "→"]  # not a cut interval's end
    assert headings == list(dict.fromkeys(order["placement"]))  # each one headed
    assert run_dots(fig) == run_dots_expected(tables[0], order, fig)  # each run on its own configuration's row
    plt.close(fig)
    fig = FIGURES["throughput"](*tables, title)  # control: one dot moved to the next row is caught
    dots = next(c for c in fig.axes[0].collections if isinstance(c, PathCollection) and len(c.get_offsets()))
    dots.set_offsets(dots.get_offsets() + [0, 1])
    assert run_dots(fig) != run_dots_expected(tables[0], order, fig)
    plt.close(fig)


def run_dots(fig: plt.Figure) -> set[tuple[float, float]]:
    return {(round(float(x), 3), float(y)) for c in fig.axes[0].collections if isinstance(c, PathCollection)
            for x, y in c.get_offsets()}


def run_dots_expected(runs: pd.DataFrame, order: pd.DataFrame, fig: plt.Figure) -> set[tuple[float, float]]:
    """(thousand tokens/s, the row's y) of every run, the row being its configuration's bar."""
    bars = next(c for c in fig.axes[0].containers if isinstance(c, BarContainer)).patches
    row_y = {config: bar.get_y() + bar.get_height() / 2 for config, bar in zip(order["config_id"], bars)}
    return {(round(value / 1e3, 3), float(row_y[config])) for config, value in zip(runs["config_id"], runs["tokens_per_s"])
            if config in row_y and pd.notna(value)}


def test_ranking_is_by_the_value_within_a_placement_not_across():
    summary = pd.DataFrame({"config_id": ["single-fp32-n1", "ddp-fp32-n1", "ddp-fp32-n2"],
                            "strategy": ["single", "ddp", "ddp"], "precision": ["fp32"] * 3, "nproc": [1, 1, 2],
                            "tokens_per_s": [1.0, 2.0, 3.0]})
    order = ranked(summary, "tokens_per_s", ascending=False)
    assert order["config_id"].to_list() == ["ddp-fp32-n1", "single-fp32-n1", "ddp-fp32-n2"]
    assert order["placement"].to_list() == ["1 process", "1 process", "2 processes"]
    # control: study order alone would have put single first
    assert summary.sort_values("tokens_per_s", ascending=False)["config_id"].to_list()[0] != "single-fp32-n1"


def test_strategies_differ_in_colour_and_marker_on_the_line_figures(study):
    tables, title = study
    for name in ("scaling", "loss_vs_time"):
        fig = FIGURES[name](*tables, title)
        ax, looks = fig.axes[0], {}
        drawn = [(c.get_label(), c.lines[0]) for c in ax.containers if hasattr(c, "has_yerr")]  # errorbars
        drawn += [(line.get_label(), line) for line in ax.get_lines()]
        for label, line in drawn:
            strategy = label.split(" ")[0]
            if strategy in set(tables[1]["strategy"]):
                looks.setdefault(strategy, set()).add((line.get_color(), line.get_marker()))
        pairs = [next(iter(styles)) for styles in looks.values()]
        assert all(len(styles) == 1 for styles in looks.values()), looks  # one look per strategy ...
        assert len(set(pairs)) == len(pairs), (name, looks)  # ... and no two strategies alike
        plt.close(fig)


def strategy_colours(fig: plt.Figure, strategies: set[str], axes: list | None = None) -> dict[str, set[tuple]]:
    """Every colour each strategy is drawn in on `axes` (default: all): bars (per row, the rows labelled on the
    first axes) and lines or error bars (per label)."""
    seen: dict[str, set[tuple]] = {}
    rows = [label.split(" ")[0] for label in _rows(fig)]
    for ax in axes or fig.axes:
        for container in ax.containers:
            if hasattr(container, "patches") and len(container.patches) == len(rows) and ax.get_yticklabels():
                for strategy, bar in zip(rows, container.patches):
                    if strategy in strategies:
                        seen.setdefault(strategy, set()).add(mcolors.to_rgb(bar.get_facecolor()))
        drawn = [(c.get_label(), c.lines[0]) for c in ax.containers if hasattr(c, "has_yerr")]
        drawn += [(line.get_label(), line) for line in ax.get_lines()]
        for label, line in drawn:
            if label.split(" ")[0] in strategies:
                seen.setdefault(label.split(" ")[0], set()).add(mcolors.to_rgb(line.get_color()))
    return seen


def test_a_strategy_has_one_colour_in_every_figure(study):
    """Colour means strategy in every figure that draws strategies (precision is a hatch or a line style); the
    time ledger's parts are shades of it (tested below) and the memory figure's left panel shows its state's
    parts in greys. The control: bars coloured by precision, as the figures once were, are caught."""
    tables, _ = study
    style, strategies = strategy_style(), set(tables[1]["strategy"])
    everywhere: dict[str, set[tuple]] = {}
    for name, fig in figures_of(study).items():
        if name != "time_ledger":  # its parts are shades; the memory figure's left panel's are greys
            for strategy, colours in strategy_colours(fig, strategies, fig.axes[1:] if name == "memory" else None).items():
                everywhere.setdefault(strategy, set()).update(colours)
        plt.close(fig)
    assert everywhere.keys() == strategies
    assert everywhere == {s: {style[s]["color"]} for s in strategies}, everywhere
    fig, ax = plt.subplots()
    ax.barh([0, 1], [1, 2], color=["#0173b2", "#de8f05"])  # ddp fp32 and ddp bf16 in precision colours
    ax.set_yticks([0, 1], ["ddp fp32", "ddp bf16"])
    assert len(strategy_colours(fig, {"ddp"})["ddp"]) == 2
    plt.close(fig)


def shades_off(fig: plt.Figure, style: dict) -> list[str]:
    """The stacked bars whose colour is not their row's strategy colour mixed with white (one fraction for all
    three channels)."""
    wrong = []
    rows = [label.split(" ")[0] for label in _rows(fig)]
    for container in fig.axes[0].containers:
        for strategy, bar in zip(rows, container.patches):
            base, colour = np.array(style[strategy]["color"]), np.array(mcolors.to_rgb(bar.get_facecolor()))
            room = 1 - base
            fractions = (colour - base)[room > 0.05] / room[room > 0.05]
            if not (np.allclose(fractions, fractions[0], atol=0.02) and -0.01 <= fractions[0] <= 1.01):
                wrong.append(f"{strategy}: {mcolors.to_hex(colour)}")
    return wrong


def test_the_time_ledger_draws_each_configuration_in_shades_of_its_strategy_colour(study):
    """Its parts differ by shade and hatch; colour stays the strategy's. The control: the parts in a palette of
    their own (as the ledger once was, with compute in single's blue) are caught."""
    tables, title = study
    style = strategy_style()
    fig = FIGURES["time_ledger"](*tables, title)
    assert len(fig.axes[0].containers) >= 3 and shades_off(fig, style) == []
    plt.close(fig)
    fig, ax = plt.subplots()
    ax.barh([0, 1], [1, 2], color=["#0173b2", "#0173b2"])  # compute in one colour whatever the strategy
    ax.set_yticks([0, 1], ["single fp32", "ddp fp32"])
    assert shades_off(fig, style) == ["ddp: #0173b2"]
    plt.close(fig)


def headings_crossed(fig: plt.Figure) -> list[str]:
    """Placement headings that a separator line runs through."""
    ax = fig.axes[0]
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    lines = [ax.transData.transform((0, line.get_ydata()[0]))[1] for line in ax.get_lines()
             if len(set(line.get_ydata())) == 1]
    crossed = []
    for text in ax.texts:
        box = text.get_window_extent(renderer)
        crossed += [text.get_text() for y in lines if box.y0 - 1 <= y <= box.y1 + 1]
    return crossed


def test_placement_headings_stand_clear_of_the_separators(study):
    tables, title = study
    fig = FIGURES["throughput"](*tables, title)
    assert len(fig.axes[0].texts) >= 2 and headings_crossed(fig) == []
    plt.close(fig)
    fig, ax = plt.subplots()  # control: a heading set just below its separator, as the figures once had it
    ax.set_ylim(3.5, -1.0)
    ax.axhline(1.5)
    ax.text(0.995, 1.55, "2 processes", transform=ax.get_yaxis_transform(), ha="right", va="bottom")
    assert headings_crossed(fig) == ["2 processes"]
    plt.close(fig)


def test_the_loss_deviation_shows_the_tolerance_and_names_what_equals_single(study):
    """The findings' 'same loss' tolerance is a line; configurations equal to single at every step (their lines
    lie on the floor, under each other) are named there."""
    tables, title = study
    fig = FIGURES["loss_deviation"](*tables, title)
    for ax in (ax for ax in fig.axes if ax.get_visible() and ax.lines):
        levels = [line.get_ydata()[0] for line in ax.get_lines() if len(set(line.get_ydata())) == 1]
        assert SAME_LOSS_TOLERANCE in levels
        floor = [t.get_text() for t in ax.texts if t.get_text().startswith("equal to single's")]
        assert len(floor) == 1
        at_floor = {line.get_label() for line in ax.get_lines() if line.get_label()[0] != "_"
                    and (np.asarray(line.get_ydata()) <= EXACT_FLOOR).all()}
        named = set(floor[0].removeprefix("equal to single's: ").split(", ")) - {"none at every step"}
        assert named == at_floor, (named, at_floor)
    plt.close(fig)


def test_a_wide_interval_is_cut_at_the_axis_end_and_its_end_written_there(study):
    """One configuration's disagreeing repeats (an interval of 2,208 to 48,414 tokens/s) once set the scale and
    flattened every other bar and line: an axis ends AXIS_ROOM past the largest value drawn, and an interval
    reaching further is cut there with its end written beside the cut. The control: an interval twenty times the
    fastest planted on the slowest configuration is cut and named, and moves no axis."""
    (runs, summary, metrics), title = study

    def drawn(name: str, table: pd.DataFrame) -> tuple[float, list[str]]:
        ax = FIGURES[name](runs, table, metrics, title).axes[0]
        end = ax.get_xlim()[1] if name == "throughput" else ax.get_ylim()[1]
        return end, sorted(value for t in ax.texts if t.get_text()[:1] in "→↑" for value in t.get_text()[2:].split(", "))

    largest = max(summary["tokens_per_s"].max(), runs["tokens_per_s"].max()) / 1e3
    end, cuts = drawn("throughput", summary)
    assert end == pytest.approx(AXIS_ROOM * largest)
    assert cuts == sorted(f"{high:,.3g}" for high in summary["tokens_per_s_ci_high"] / 1e3 if high > end)
    wide = summary.assign(tokens_per_s_ci_high=summary["tokens_per_s_ci_high"].mask(
        summary.index == summary["tokens_per_s"].idxmin(), 20 * summary["tokens_per_s"].max()))
    assert drawn("throughput", wide) == (end, sorted([*cuts, f"{20 * summary['tokens_per_s'].max() / 1e3:,.3g}"]))

    top, cut_lines = drawn("scaling", summary)
    one_machine = summary[summary["nodes"] == 1] if "nodes" in summary else summary
    assert top == pytest.approx(AXIS_ROOM * max(one_machine["speedup"].max(), summary["nproc"].max()))  # the ideal
    slow = one_machine["speedup"].idxmin()
    wide = summary.assign(speedup_ci_high=summary["speedup_ci_high"].mask(summary.index == slow, 50.0))
    assert drawn("scaling", wide) == (top, sorted([*cut_lines, "50"]))


def test_loss_over_time_has_a_legend_entry_per_strategy_precision_and_process_count(study):
    """Fifteen lines once had fifteen legend entries, and n=1 and n=2 of a configuration were drawn alike: a
    strategy keeps its colour, a precision its style, a process count its width, each named once."""
    (runs, summary, metrics), title = study
    fig = FIGURES["loss_vs_time"](runs, summary, metrics, title)
    ax = fig.axes[0]
    first = metrics[(metrics["repeat"] == metrics["repeat"].min()) & (metrics["nodes"] == 1)]
    counts = sorted(int(n) for n in first["nproc"].unique())
    labels = [t.get_text() for legend in fig.legends for t in legend.get_texts()]
    assert len(labels) == first["strategy"].nunique() + first["precision"].nunique() + len(counts), labels
    assert [f"{n} process{'es' * (n > 1)}" for n in counts] == labels[-len(counts):]
    widths = {}  # per (strategy, precision): the widths of its lines, one per process count
    for line in ax.get_lines():
        strategy, precision, count = line.get_label().split(" ")[:3]
        widths.setdefault((strategy, precision), {})[count] = line.get_linewidth()
    several = [drawn for drawn in widths.values() if len(drawn) > 1]
    assert len(several) == (first.groupby(["strategy", "precision"])["nproc"].nunique() > 1).sum()
    assert all(len(set(drawn.values())) == len(drawn) for drawn in several)  # counts told apart
    # one line per configuration on one machine: runs on several nodes join no line of theirs
    assert len(ax.get_lines()) == first["config_id"].nunique()
    assert ax.get_xscale() == "log"
    if title.endswith("cpu-study"):  # the control: more lines than entries, so a label per line is caught above
        assert len(ax.get_lines()) > len(labels)
    plt.close(fig)


def test_memory_orders_by_the_state_a_rank_holds_and_draws_each_peak_above_the_lowest(study):
    (runs, summary, metrics), title = study
    fig = FIGURES["memory"](runs, summary, metrics, title)
    state, peak = fig.axes[:2]
    lowest = summary["peak_mem_bytes"].min() / 2**20
    assert f"Peak above the lowest, {lowest:,.0f} MiB" in peak.get_title()
    bars = [bar.get_width() for bar in peak.patches]
    assert min(bars) == pytest.approx(0) and max(bars) == pytest.approx(summary["peak_mem_bytes"].max() / 2**20 - lowest)
    held = ranked(summary.assign(_state=summary[["param_bytes", "grad_bytes", "optimizer_bytes"]].sum(axis=1)),
                  "_state", ascending=True)
    assert _rows(fig) == [label for label in held.apply(lambda r: f"{r['strategy']} {r['precision']}", axis=1)]
    # the control: the peaks' order is another one, which the rows no longer follow
    by_peak = ranked(summary, "peak_mem_bytes", ascending=True)
    assert by_peak["config_id"].tolist() != held["config_id"].tolist()
    plt.close(fig)


@pytest.mark.slow  # the two-node study's rebuild
def test_a_study_of_nodes_alone_draws_every_figure(reference_study):
    """A tune on emulated nodes has no run on one machine: every figure is drawn all the same (the loss over time once
    ended `gpt2dist plot` on its empty legend), the loss over time saying it has no such run; the control, the same
    study with its one-machine runs, draws its lines there."""
    use_theme()
    out = reference_study("two-node-cpu")
    tables = [pd.read_csv(out / name) for name in ("runs.csv", "summary.csv", "metrics.csv")]
    nodes = [table[table["nodes"] > 1] for table in tables]
    for name in (*FIGURES, LINK_FIGURE):
        plt.close(draw(name, nodes, f"nodes alone: {name}"))
    alone = FIGURES["loss_vs_time"](*nodes, "nodes alone")
    assert "no run on one machine in this study" in [text.get_text() for text in drawn_text(alone)]
    assert not alone.axes[0].get_lines() and not alone.legends
    both = FIGURES["loss_vs_time"](*tables, "both")
    assert both.axes[0].get_lines() and both.legends
    plt.close(alone), plt.close(both)
