"""`gpt2dist report`: results/summary.md, the study's comparison table regenerated from
summary.json, with the environment it was measured in."""

from __future__ import annotations

import collections
import math
from pathlib import Path

import pandas as pd
from tabulate import tabulate

from gpt2dist.config.configuration import Configuration
from gpt2dist.config.placement import Kind, Placement
from gpt2dist.io import atomic_write_text
from gpt2dist.pipeline.layout import FIGURES, LINK_FIGURE
from gpt2dist.results.added_repeats import undecided
from gpt2dist.results.summarise import in_study_order
from gpt2dist.results.findings import UNTESTABLE
from gpt2dist.inputs import read_summary
from gpt2dist.forecast.link_model import worst_error
from gpt2dist.forecast.prediction import STEP_TARGET, prediction_errors
from gpt2dist.results.ranking import answer_markdown
from gpt2dist.results.time_ledger import LEDGER, PART_WORDS, ledger_columns


def _missing(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _num(value, fmt: str, scale: float = 1.0) -> str:
    return "n/a" if _missing(value) else format(value / scale, fmt)


def _with_ci(row: dict, key: str, fmt: str, scale: float = 1.0) -> str:
    low, high = row.get(f"{key}_ci_low"), row.get(f"{key}_ci_high")
    middle = _num(row[key], fmt, scale)
    if _missing(low) or _missing(high):
        return middle
    return f"{middle} ({_num(low, fmt, scale)} to {_num(high, fmt, scale)})"


def _speedup(row: dict) -> str:
    if row.get("vs_baseline") in ("baseline", "no baseline"):
        return row["vs_baseline"]
    return f"{_with_ci(row, 'speedup', '.2f')}: {row.get('vs_baseline')}"


def _mark(row: dict) -> str:
    if row.get("from_disturbed"):
        return "only disturbed runs"
    return f"{row['disturbed_runs']} left out" if row.get("disturbed_runs") else ""


# Columns that may be empty on a whole study, and why (a table says so in one line instead of a column of "n/a")
EMPTY_BECAUSE = {"MFU": "MFU (GPUs only: a CPU has no peak FLOP/s to measure it against)",
                 "J to target (95% interval)": "energy to the target (only GPUs report power)"}
EMPTY = ("n/a", "not measured")


def without_empty_columns(rows: list[list], headers: list[str]) -> tuple[list[list], list[str], str]:
    """The table without the columns of EMPTY_BECAUSE that hold no value on any row, and a line naming them."""
    empty = [i for i, header in enumerate(headers)
             if header in EMPTY_BECAUSE and rows and all(row[i] in EMPTY for row in rows)]
    kept = [i for i in range(len(headers)) if i not in empty]
    note = ("Left out, as no row has a value: " + "; ".join(EMPTY_BECAUSE[headers[i]] for i in empty) + ".") if empty \
        else ""
    return [[row[i] for i in kept] for row in rows], [headers[i] for i in kept], note


def uncommitted(summary: dict) -> str:
    """The title's mark on a study whose runs no commit regenerates (its first line says so, not a footnote)."""
    return " (from uncommitted changes)" if (summary.get("code") or {}).get("dirty") else ""


def warnings_markdown(summary: dict) -> str:
    """What is missing or was disturbed, first, so nobody reads the table without knowing."""
    lines = []
    code = summary.get("code") or {}
    if code.get("dirty"):
        commits = ", ".join(commit[:10] for commit in code["commits"]) or "no commit"
        lines.append(f"**Made from uncommitted changes (on {commits}): no commit regenerates these runs.**\n")
    if summary.get("mixed_hardware"):
        lines.append(f"**These runs were made on different hardware ({'; '.join(summary['mixed_hardware'])}), "
                     "compared at the user's request (collect --mixed-hardware): a gap between strategies may be "
                     "a gap between machines.**\n")
    if summary.get("missing_runs"):
        lines.append(f"**Failed or missing runs: {len(summary['missing_runs'])}. Their configurations are "
                     "summarised from the runs that completed, or not at all; running the study again "
                     "(`snakemake --cores all`, or `dvc repro --ignore-errors`) trains these alone:**\n")
        lines += [f"- `{run_id}`: {why}" for run_id, why in summary["missing_runs"].items()]
        lines.append("")
    if summary.get("disturbed_runs"):
        lines.append(f"**Disturbed or outlying runs, left out of the statistics: {len(summary['disturbed_runs'])} (a "
                     "configuration with no other run is marked 'only disturbed runs'):**\n")
        lines += [f"- `{run_id}`: {why}" for run_id, why in summary["disturbed_runs"].items()]
        lines.append("")
    return "\n".join(lines)


def export_markdown(summary: dict) -> str:
    """Where runs kept their final checkpoints: the command that takes each placement's fastest elsewhere."""
    if not summary.get("export"):
        return ""
    lines = ["", "**To take the weights elsewhere**: at each placement, the top tier's fastest configuration with a kept "
             "final checkpoint (study.keep_checkpoints), which `gpt2dist export` writes as a transformers GPT-2 "
             "(`GPT2LMHeadModel.from_pretrained` loads it):", ""]
    lines += [f"- {chosen['placement']}: `gpt2dist export --run {chosen['run_id']} --out {chosen['run_id']}-hf`"
              for chosen in summary["export"]]
    return "\n".join(lines) + "\n"


def added_markdown(summary: dict) -> str:
    """What the added rounds trained, where they stopped, and what is still undecided: the answer's limits."""
    plans = summary.get("added_rounds") or []
    if not plans:
        return ""
    budget = plans[-1]["budget"]
    limits = " and ".join(filter(None, [f"{budget['max_runs']} runs" if budget["max_runs"] else "",
                                        f"{budget['max_minutes']:g} minutes" if budget["max_minutes"] else ""]))
    lines = ["", "## Repeats added where the ranking was undecided", "",
             f"After the planned repeats, up to {budget['rounds']} added round{'s' * (budget['rounds'] != 1)} "
             f"(at most {limits} in all), each a repeat of the configurations whose ratio to their placement's top "
             f"could still be 1 or more than {budget['resolve']:.0%} below it, beside that top:", ""]
    for plan in plans:
        if plan["runs"]:
            left = "; ".join(f"{', '.join(configs)} ({placement})" for placement, configs in plan["left_out"].items())
            lines.append(f"- round {plan['round']} (repeat {plan['repeat']}): {', '.join(plan['runs'])}"
                         + (f"; left out, beyond the budget: {left}" if left else ""))
        else:
            lines.append(f"- round {plan['round']}: no runs, as {plan['stopped']}")
    still = undecided(summary["answer"], budget["resolve"])
    ran_out = "the budget is spent" if not plans[-1]["runs"] and still else \
        f"the {budget['rounds']} added round{'s' * (budget['rounds'] != 1)} are used"
    lines += ["", f"Still undecided, as {ran_out}: " + "; ".join(
        f"{', '.join(configs[1:])} against {configs[0]} ({placement})" for placement, configs in still.items()) + "."
        if still else "Every configuration is now placed against its placement's top, or tied with it."]
    return "\n".join(lines) + "\n"


def stored_studies(places: list[Path], summary: dict, own: Path) -> list[dict]:
    """The summaries of the other studies of this study's preset in `places` (each a study's results directory or
    a directory of them, as docs/reference is); a place that does not exist holds none."""
    found = []
    for place in places:
        for path in sorted([Path(place) / "summary.json", *Path(place).glob("*/summary.json")]):
            if path.is_file() and path.resolve() != (own / "summary.json").resolve():
                other = read_summary(path.parent)
                if other["preset"] == summary["preset"]:
                    found.append(other)
    return found


def elsewhere(mine: str, theirs: list[str]) -> tuple[str, bool]:
    """How a claim fared in the other studies ('supported in 2 of 2'), and whether it is unstable: judged here
    and there, with a different verdict."""
    if not theirs:
        return "not judged in them", False
    counts = collections.Counter(theirs)
    text = ", ".join(f"{verdict} in {n}" for verdict, n in counts.most_common()) + f" of {len(theirs)}"
    return text, mine != UNTESTABLE and any(verdict not in (mine, UNTESTABLE) for verdict in theirs)


def findings_markdown(summary: dict, others: list[dict] = ()) -> str:
    """The claims with their verdicts; with other stored studies of the preset, how each fared in them, and a
    verdict they do not share marked unstable: a claim at the edge of the noise is no finding."""
    headers = ["claim", "verdict", "statistic (95% intervals, undisturbed runs only)"]
    rows = []
    for finding in summary.get("findings", []):
        verdict, row = finding["verdict"], [f"{finding['text']} ({finding['source']})"]
        if others:
            theirs = [g["verdict"] for other in others for g in other.get("findings", []) if g["claim"] == finding["claim"]]
            text, unstable = elsewhere(verdict, theirs)
            verdict = f"{verdict}, but unstable" if unstable else verdict
            rows.append([*row, verdict, finding["statistic"], text])
        else:
            rows.append([*row, verdict, finding["statistic"]])
    if others:
        headers.append(f"in the {len(others)} other stored stud{'ies' if len(others) > 1 else 'y'} of this preset")
    return tabulate(rows, headers=headers, tablefmt="github")


def link_model_markdown(summary: dict) -> str:
    """Predicted against measured step times on the emulated links, and the model's worst error."""
    model = summary.get("link_model") or []
    if not model:
        return ""
    rows = [[row["strategy"], row["precision"], row["nproc"], f"{row['link_mbit']:g}",
             _num(row["one_machine_step_time_s"] * 1e3, ",.1f"), _num(row["modelled_link_s"] * 1e3, ",.1f"),
             _num(row["predicted_step_time_s"] * 1e3, ",.1f"),
             f"{_num(row['measured_step_time_s'] * 1e3, ',.1f')} ({_num(row['measured_step_time_ci_low_s'], ',.1f', 1e-3)}"
             f" to {_num(row['measured_step_time_ci_high_s'], ',.1f', 1e-3)})",
             _num(row["error"], "+.0%"), _num(row["modelled_bytes_per_step"], ",.2f", 2**20),
             _num(row["measured_bytes_per_step"], ",.2f", 2**20)] for row in model]
    table = tabulate(rows, headers=["strategy", "precision", "processes", "link Mbit/s", "one machine ms",
                                    "+ modelled link ms", "= predicted ms", "measured ms (95% interval)", "error",
                                    "modelled MiB/step", "measured MiB/step on the link"], tablefmt="github")
    worst = worst_error(pd.DataFrame(model))
    return f"""## Emulated links: the link model against measurement

Two nodes emulated on this machine (network namespaces joined by a bridge, each node's link shaped by
`tc tbf`; latency not emulated, and the nodes share the machine's cores). The model: a step on the link takes
the same configuration's step on one machine plus the bytes the busiest rank sends per step (the traffic
model) over the link's bandwidth, with no overlap and no protocol overhead. Measured bytes are what the
busiest node's interface sent over the run per step (start-up, evaluation and TCP/IP headers included).
Worst error of the model on these links: {_num(worst, '.0%')}.

{table}
"""


def convergence_markdown(configs: pd.DataFrame, target: float | dict[str, float | None] | None) -> str:
    """Time (and energy, where GPUs report power) to the target validation loss, and the numerics check; `target`:
    the study's, or one per model size where it trains sizes of its own."""
    targets = {size: value for size, value in (target if isinstance(target, dict) else {"": target}).items()
               if value is not None and not _missing(value)}
    if "time_to_target_s" not in configs or not targets:
        return ""  # collected before time to target existed, or no single fp32 run to set the target
    target_text = "; ".join(f"{value:.4f}" + (f" for {size}" if size else "") for size, value in targets.items())
    steps, everyone = set(configs["steps_to_target"]), bool((configs["reached_target"] == configs["repeats"]).all())
    if everyone and len(steps) == 1 and not configs.empty:
        table = (f"Every configuration reached the target in each repeat counted, at step {steps.pop():.0f}, its "
                 "first evaluation at or below it, so time to the target only restates throughput here: a lower "
                 "target or more frequent evaluations (train.eval_interval) would let it tell configurations apart.")
    else:
        rows = [[*([row["size"]] if "size" in row else []), row["strategy"], row["precision"], row["nproc"],
                 f"{row['reached_target']:.0f} of {row['repeats']:.0f}",
                 _num(row["steps_to_target"], ",.0f"), _with_ci(row, "time_to_target_s", ",.2f"),
                 _with_ci(row, "energy_to_target_j", ",.0f")
                 if not _missing(row.get("energy_to_target_j")) else "not measured",
                 row.get("numerics") if isinstance(row.get("numerics"), str) and row.get("numerics") else "no"]
                for row in configs.to_dict("records")]
        rows, headers, left_out = without_empty_columns(rows, [
            *(["size"] if "size" in configs else []), "strategy", "precision", "processes", "reached", "steps (median)", "training s to target (95% interval)",
            "J to target (95% interval)", "needs more steps than single fp32?"])
        table = f"{left_out}\n\n" * bool(left_out) + tabulate(rows, headers=headers, tablefmt="github")
    flagged = [Configuration.of(row).name_with_processes() for row in configs.to_dict("records")
               if isinstance(row.get("numerics"), str) and row.get("numerics")]
    return f"""## Time to the target loss

Throughput rewards a configuration whose speed comes from changed numerics even if it learns less per step, so
each run is also timed to its first evaluation at or below a validation loss of {target_text} (study.target_val_loss;
by default 1% above the worst final validation loss of single's fp32 runs). Training seconds count the steps
before that evaluation; steps are resolved to the evaluation interval. A configuration needs more steps than
single fp32 when a repeat never reached the target, or when a one-sided Welch t-test over the repeats says so at
the 5% level (with no spread on either side: when every repeat needed more), as MLPerf checks a submission's
convergence against reference points. Energy is rank 0's GPU
power at each step times the step's time, for every GPU of the run; CPUs report none ("not measured").
{"Flagged: " + ", ".join(flagged) + "." if flagged else "No configuration needs more steps than single fp32 here."}

{table}
"""


def prediction_markdown(configs: pd.DataFrame) -> str:
    """The planner's predictions against this study's runs: its error per strategy, and what it leaves out."""
    if "step_time_error" not in configs:
        return ""  # collected before predictions existed
    errors = prediction_errors(configs)
    rows = [[row["strategy"], row["configurations"], _num(row["worst_state_error"], "+.1%"),
             _num(row["median_step_error"], "+.0%"), _num(row["worst_step_error"], "+.0%")]
            for row in errors.to_dict("records")]
    table = tabulate(rows, headers=["strategy", "configurations", "model state: worst error",
                                    "step time: median error", "step time: worst error"], tablefmt="github")
    missed = errors[errors["worst_step_error"].abs() > STEP_TARGET]["strategy"].tolist()
    verdict = (f"Beyond {STEP_TARGET:.0%} here: {', '.join(missed)}." if missed
               else f"Every strategy within {STEP_TARGET:.0%} here.")
    return f"""## Predictions against the runs

What `gpt2dist plan` predicts, checked on this study (error = predicted / measured - 1). Model state is
counted from the parameters each strategy leaves rank 0 (config/memory.py); step time is single's measured
step divided among the processes (sharing the machine's cores on CPUs, a device each on GPUs), a pipeline's
bubble, and the traffic model's bytes at the bus bandwidth each run measured before training, with no
overlap. Single's step calibrates the model, so its own error is not counted. The model does not know that
tensor parallelism's smaller matrices compute less efficiently, nor each rank's Python overhead.
{verdict}

{table}
"""


def trace_links(kept: dict | None) -> str:
    """A configuration's kept traces as links, one per rank ('-' where none was kept)."""
    if not kept:
        return "-"
    return " ".join(f"[{rank}]({path})" for rank, path in enumerate(kept["files"]))


def ledger_markdown(configs: pd.DataFrame, traces: dict[str, dict]) -> str:
    """'Where the time goes': each configuration's traced step split into the ledger's parts, and its traces."""
    columns = ledger_columns(configs)
    rows = []
    for row in configs.to_dict("records"):
        if any(_missing(row.get(c)) for c in columns):
            continue
        step = sum(row[c] for c in columns)
        rows.append([*([row.get("size")] if "size" in row else []), row["strategy"], row["precision"], row["nproc"],
                     _num(step * 1e3, ",.1f"),
                     *(_num(row[c] / step, ".0%") for c in columns),
                     _num(row.get("traced_collective_bytes_per_step"), ",.2f", 2**20),
                     _num(row.get("comm_bytes_per_step"), ",.2f", 2**20),
                     *([trace_links(traces.get(row["config_id"]))] if traces else [])])
    if not rows:
        return ""
    table = tabulate(rows, headers=[*(["size"] if "size" in configs else []), "strategy", "precision", "processes",
                                    "traced step ms",
                                    *(PART_WORDS[c.removeprefix(LEDGER)] for c in columns),
                                    "collective payload MiB/step (traced)", "sent MiB/step (model)",
                                    *(["trace by rank"] if traces else [])],
                     tablefmt="github")
    opened = ("" if not traces else "\n\nEach rank's last traced step of one run per configuration is kept as a "
              "gzipped Chrome trace (the trace column, by rank): ui.perfetto.dev and chrome://tracing open one as "
              "it is, and Holistic Trace Analysis reads a run's ranks together (on GPU runs).")
    return f"""## Where the time goes

The last steps of each run, traced with torch.profiler (median over the repeats; these steps are left out of
the throughput numbers above, since the profiler slows them). The parts add up to the traced step: compute;
communication that ran while compute did (hidden) and while nothing else did (exposed); building batches; and
idle time, when the rank neither computed nor communicated (Python and launch overhead, waiting for another
rank outside a collective). A pipeline's bubble is a stage waiting in its receive for its neighbour, so it counts
as exposed communication. Horovod's collectives run on its own thread, which the profiler does not trace: its
waits for them count as exposed communication, and its hidden part reads 0. The traced payload is what the
torch.distributed collectives carried per step; the model column is what the busiest rank sends by the traffic
model (for a ring all-reduce over n ranks, 2(n-1)/n of the payload).{opened}

{table}
"""


def summary_markdown(summary: dict, others: list[dict] = ()) -> str:
    configs = in_study_order(pd.DataFrame(summary["configs"].values())).to_dict("records")
    named = any(row.get("label") for row in configs)  # a paper preset: its names for the rows come first
    spread = any(Placement.of(row).kind is not Kind.ONE_MACHINE for row in configs)  # runs on several nodes
    sized = any("size" in row for row in configs)  # a study of model sizes of its own
    rows = [
        [*([row.get("label") or ""] if named else []), *([row.get("size") or ""] if sized else []), row["strategy"],
         row["precision"], row["nproc"],
         *([Placement.of(row).where()] if spread else []), row["repeats"],
         _mark(row),
         _with_ci(row, "tokens_per_s", ",.0f"), _speedup(row),
         _with_ci(row, "scaling_efficiency", ".2f"), _num(row["step_time_s"] * 1e3, ",.1f"),
         _num(row["step_time_p90_s"] * 1e3, ",.1f"), _num(row.get("overhead_s"), ",.1f"),
         _num(row.get("model_state_bytes"), ",.0f", 2**20), _num(row.get("comm_bytes_per_step"), ",.1f", 2**20),
         _num(row["peak_mem_bytes"], ",.0f", 2**20),
         _num(row.get("final_val_loss"), ".3f"), _num(row.get("mfu"), ".1%")]
        for row in configs
    ]
    rows, headers, left_out = without_empty_columns(rows, [
        *(["paper's name"] if named else []), *(["size"] if sized else []), "strategy", "precision", "processes",
        *(["where"] if spread else []),
        "repeats", "disturbed", "tokens/s (95% interval)", "speedup (95% interval): vs baseline", "efficiency",
        "step ms p50", "step ms p90", "overhead s", "model state MiB/rank", "sent MiB/step", "peak MiB",
        "final val loss", "MFU"])
    table = tabulate(rows, headers=headers, tablefmt="github")
    mfu_words = (" MFU is against the peak of the arithmetic each row ran: fp32 rows against the GPU's fp32 peak, "
                 "16-bit rows against its tensor cores', so the MFUs of two precisions do not compare."
                 if "MFU" in headers else "")
    versions = ", ".join(f"{k} {v}" for k, v in summary["versions"].items() if v)
    dropped = ", ".join(f"{config} ({why})" for config, why in summary["dropped_configurations"].items()) or "none"
    ledger = ledger_markdown(in_study_order(pd.DataFrame([{**row, "config_id": config}
                                                          for config, row in summary["configs"].items()])),
                             summary["traces"])
    drawn = FIGURES + ((LINK_FIGURE,) if summary.get("link_model") else ())
    figures = "\n".join(f"![{name}](figures/{name}.png)" for name in drawn)
    return f"""# gpt2dist results: preset `{summary['preset']}`{uncommitted(summary)}

Hardware: {summary['hardware']}. Software: {versions}.

{warnings_markdown(summary)}
{answer_markdown(summary["answer"]) if summary.get("answer") else ""}{export_markdown(summary)}{added_markdown(summary)}
## Every configuration

Each run's throughput is its median after its first {summary['excluded_steps']} steps. The table gives the geometric
mean over a configuration's undisturbed repeats with a 95% t-interval on the log scale (it cannot leave the
positive numbers; with two or three repeats it is wide, as it should be). Speedup is over the one-process run
of the same precision (`single`'s, else the strategy's own; across a cluster's nodes, the same strategy on one
node with as many processes per node), paired by repeat round, and says whether its interval excludes 1
("faster", "slower") or not ("not distinguishable"); efficiency is speedup / the processes (or nodes) added.
Overhead is wall time outside the training steps (start-up, evaluation, checkpoints). Model state is the
parameters, gradients and optimizer state rank 0 holds. Sent is what the busiest rank sends per step by
the strategy's traffic model (ring collectives, activations at pipeline boundaries), not a measurement.{mfu_words} Configurations the planned cluster cannot hold: {dropped}.
{left_out}

{table}

{ledger}
{convergence_markdown(in_study_order(pd.DataFrame(summary["configs"].values())), summary.get("target_val_loss"))}
{prediction_markdown(in_study_order(pd.DataFrame(summary["configs"].values())))}
## The papers' claims on this study's data

{findings_markdown(summary, others)}

{link_model_markdown(summary)}

{figures}
"""


def report(results: Path, against: list[Path] = ()) -> Path:
    """summary.md, and findings.md: the claims alone, for readers who want only the verdicts; each claim beside
    its verdicts in the other stored studies of the preset found in `against`."""
    results = Path(results)
    summary = read_summary(results)
    others = stored_studies(against, summary, results)
    compared = (f" Beside each verdict: the same claim in the {len(others)} other stored "
                f"stud{'ies' if len(others) > 1 else 'y'} of preset `{summary['preset']}`; a verdict they do not "
                "share is marked unstable." if others else
                f" No other stored study of preset `{summary['preset']}` was found to set these verdicts beside (in "
                f"{', '.join(str(place) for place in against)}), so none is checked for stability." if against else "")
    atomic_write_text(results / "findings.md", f"""# The seed studies' claims, checked: preset `{summary['preset']}`{uncommitted(summary)}

Hardware: {summary['hardware']}. Verdicts use undisturbed runs only; see summary.md for the numbers. Each interval here is 95% for its own comparison; the answer in summary.md widens its intervals for the number of comparisons in a placement, so the same ratio can show a wider interval there.{compared}

{findings_markdown(summary, others)}
""")
    path = results / "summary.md"
    atomic_write_text(path, summary_markdown(summary, others))
    return path
