"""A tune's answer (`gpt2dist tune`; results/tune/summary.md, and tune.md in a rebuild) and its calibration
(calibration.json, which `recommend --calibration` reads), from its study's collected summary and its plan
(tune.json): the measured tiers in the study's words, each candidate's predicted step time and memory beside the
measured ones with where the time ledger puts each gap, the rounds and why they stopped, and what was ruled out
without running. Written from those two files alone, so a rebuild from the tune's bundle writes the same."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
from tabulate import tabulate

from gpt2dist.config.placement import Placement
from gpt2dist.forecast.implementations import ENGINE_NAME
from gpt2dist.forecast.published import ALLOCATED, table_header
from gpt2dist.inputs import read_json, read_summary
from gpt2dist.io import atomic_write_json, atomic_write_text
from gpt2dist.pipeline.duration import minutes
from gpt2dist.pipeline.layout import TUNE_MEASURED, TUNE_PLAN
from gpt2dist.pipeline.run import Run
from gpt2dist.results.ranking import answer_markdown
from gpt2dist.results.report import warnings_markdown
from gpt2dist.results.statistics import log_interval
from gpt2dist.results.time_ledger import LEDGER, PART_WORDS

PLAN_KEYS = ("preset", "precision", "cluster", "candidates", "kept_because", "ruled_out", "splits", "budget_s",
             "ratio_error", "model", "repeats", "rounds", "halving")
MIB = 2**20
# The prediction's terms beside the time ledger's parts: a pipeline's bubble is a stage waiting in its receive, which
# the ledger counts as exposed communication; the model has no data loading nor idle time
PREDICTED_PARTS = {"compute_s": ("compute_s",), "comm_hidden_s": ("comm_hidden_s",),
                   "comm_exposed_s": ("comm_exposed_s", "bubble_s"), "data_s": (), "idle_s": ()}


def read_plan(results: Path) -> dict:
    return read_json(Path(results) / TUNE_PLAN, "gpt2dist tune", PLAN_KEYS)


def config_of(plan: dict, strategy: str) -> str:
    cluster = plan["cluster"]
    return Run(strategy, plan["precision"], cluster["nproc"], 0, cluster["nodes"], cluster["link_mbit"],
               cluster["emulated"], plan.get("size")).config_id


def beside(summary: dict, plan: dict) -> list[dict]:
    """Each candidate's prediction (tune.json) beside its measurement (summary.json), with the gap's ledger parts."""
    splits = {row["strategy"]: row for row in plan["splits"]}
    rows = []
    for strategy in plan["candidates"]:
        predicted, measured = splits[strategy], summary["configs"].get(config_of(plan, strategy)) or {}
        step = measured.get("step_time_s")
        ledger = {part: measured.get(f"{LEDGER}{part}") for part in PREDICTED_PARTS}
        gap = {part: value - sum(predicted.get(term) or 0.0 for term in PREDICTED_PARTS[part])
               for part, value in ledger.items() if _known(value)}
        rows.append({
            "strategy": strategy, "why": plan["kept_because"][strategy], "repeats": measured.get("repeats", 0),
            "predicted_step_s": predicted["step_s"], "measured_step_s": step,
            "measured_step_low_s": measured.get("step_time_s_ci_low"),
            "measured_step_high_s": measured.get("step_time_s_ci_high"),
            "error": predicted["step_s"] / step - 1 if _known(step) else None,
            "predicted_peak_mib": predicted["peak_gib"] * 1024,
            "measured_peak_mib": _mib(measured.get("peak_mem_bytes")),
            "predicted_state_mib": predicted["state_gib"] * 1024,
            "counted_state_mib": _mib(measured.get("model_state_bytes")), "ledger_gap_s": gap})
    return rows


def _known(value) -> bool:
    return value is not None and not (isinstance(value, float) and math.isnan(value))


def _mib(value) -> float | None:
    return value / MIB if _known(value) else None


def _ms(value, digits: int = 1) -> str:
    return f"{value * 1e3:,.{digits}f}" if _known(value) else "not measured"


def gap_words(gap: dict[str, float]) -> str:
    """The ledger's parts that make most of the gap between measured and predicted, largest first."""
    total = sum(abs(seconds) for seconds in gap.values())
    named = [f"{seconds * 1e3:+,.1f} ms {PART_WORDS[part]}" for part, seconds in
             sorted(gap.items(), key=lambda item: -abs(item[1])) if total and abs(seconds) >= 0.2 * total]
    return ", ".join(named) or "no part of it"


def calibration_of(plan: dict, summary: dict, rows: list[dict]) -> dict:
    """What `recommend --calibration` reads: per split measured here, its measured over predicted step, and their
    geometric mean for the splits the tune did not measure, with the cluster and the model they hold for."""
    kept = ("predicted_step_s", "measured_step_s", "measured_step_low_s", "measured_step_high_s")
    splits = {row["strategy"]: {key: row[key] for key in kept} | {
        "runs": row["repeats"], "factor": row["measured_step_s"] / row["predicted_step_s"]}
        for row in rows if _known(row["measured_step_s"])}
    typical = log_interval([split["factor"] for split in splits.values()])[0] if splits else None
    return {"tune": {"made_by": "gpt2dist tune", "made_at": plan.get("started_at"), "preset": plan["preset"],
                     "size": plan.get("size"), "precision": plan["precision"], "cluster": plan["cluster"],
                     "hardware": summary["hardware"], "model": plan["model"], "basis": plan.get("basis"),
                     "ratio_error": plan["ratio_error"], "splits": splits,
                     "typical_factor": None if typical is None or math.isnan(typical) else typical}}


def measured_rows(plan: dict, summary: dict, rows: list[dict]) -> pd.DataFrame | None:
    """A GPU tune's measured splits as rows of the table the GPU step model is judged on (forecast.published), its
    cluster one group of a source of its own, so that `validate-published --add` predicts them with the constants
    fitted to every other source: the model's error and its pick on this cluster, out of sample. None on CPUs (the
    GPU step model predicts GPUs), where nothing was measured, or where tune.json predates its `trained` setup."""
    cluster, trained = plan["cluster"], plan.get("trained")
    measured = [row for row in rows if _known(row["measured_step_s"])]
    if cluster["device"] != "cuda" or not trained or not measured:
        return None
    started, links = plan["started_at"], cluster["links"]
    source = f"gpt2dist tune {started}"

    def published(row: dict) -> str:
        interval = f" ({_ms(row['measured_step_low_s'])} to {_ms(row['measured_step_high_s'])} ms, 95%)" \
            if _known(row["measured_step_low_s"]) else ""
        return f"step {_ms(row['measured_step_s'])} ms{interval} over {row['repeats']} run(s)"

    table = pd.DataFrame([{
        "row": f"{source} {row['strategy']}", "source": source,
        "where": f"{TUNE_PLAN} and summary.json of the tune started {started} on {summary['hardware']}",
        "group": f"tune-{cluster['nodes']}x{cluster['gpus_per_node']}-{cluster['gpu']}-{started}",
        "gpu": cluster["gpu"], "gpus": cluster["nproc"], "gpus_per_node": cluster["gpus_per_node"],
        "nodes": cluster["nodes"], "link_inside": links["inside"], "link_across": links["across"],
        "nics": links["nics"], **trained, "strategy": row["strategy"], "outside": "", "precision": plan["precision"],
        "implementation": ENGINE_NAME, "published": published(row), "step_s": row["measured_step_s"],
        "conversion": "each run's median step after its warm-up, their geometric mean over the runs the study "
                      "summarised (the undisturbed ones where any)",
        "memory_gib": row["measured_peak_mib"] / 1024 if _known(row["measured_peak_mib"]) else "",
        "memory_measure": ALLOCATED if _known(row["measured_peak_mib"]) else "", "confidence": "high",
        "unclear": ""} for row in measured])
    return table[table_header()]


def stop_words(summary: dict, plan: dict) -> str:
    """Why the rounds ended: one tier left, the budget spent, or the rounds used (and what was still undecided)."""
    rounds = summary.get("added_rounds") or []
    if not plan["rounds"]:
        return "after the first round, as asked (--rounds 0)"
    last = rounds[-1] if rounds else None
    if last is None:
        return "before any round was decided (the study's added rounds did not run)"
    still = "; ".join(", ".join(configs[1:]) + f" against {configs[0]}" for configs in last["undecided"].values())
    if last["stopped"] == "every configuration is placed or tied":
        return (f"after round {last['round']}: one tier is left (every candidate still in is tied with the top, or "
                "was placed below it)")
    if last["stopped"]:
        return f"after round {last['round']}: {last['stopped']}" + (f"; still undecided: {still}" if still else "")
    return f"after round {last['round'] + 1}: its {plan['rounds']} added rounds are used" + \
        (f"; still undecided: {still}" if still else "")


def rounds_markdown(summary: dict, plan: dict) -> list[str]:
    """Each round: what it ran; after it, what was dropped (slower beyond the noise), repeated, and tied."""
    lines = [f"- round 1: every candidate, {plan['repeats']} repeats each, interleaved (repeat 0 of every candidate, "
             "then repeat 1, ...)"]
    dropped: set[str] = set()
    for decided in summary.get("added_rounds") or []:
        for placement, gaps in (decided.get("gaps") or {}).items():
            slower = [config for config, gap in gaps.items() if gap == "slower" and config not in dropped]
            undecided = (decided.get("undecided") or {}).get(placement, [])
            tied = [config for config, gap in gaps.items()
                    if gap in ("not distinguishable", "faster") and config not in undecided]
            dropped.update(slower)
            said = "; ".join(filter(None, [f"slower than the top beyond the noise, dropped: {', '.join(slower)}"
                                           if slower else "", f"undecided, repeated beside the top ({undecided[0]}): "
                                           f"{', '.join(undecided[1:])}" if undecided else "",
                                           f"tied with the top: {', '.join(tied)}" if tied else ""]))
            lines.append(f"- after round {decided['round']}: {said or 'nothing newly placed'}")
        if decided["runs"]:
            lines.append(f"- round {decided['round'] + 1} (repeat {decided['repeat']}): {', '.join(decided['runs'])}")
    return lines


def table_row(row: dict) -> list[str]:
    """A candidate's line of the predicted-beside-measured table."""
    measured = _ms(row["measured_step_s"])
    if _known(row["measured_step_low_s"]):
        measured += f" ({_ms(row['measured_step_low_s'])} to {_ms(row['measured_step_high_s'])})"
    state = f"{row['predicted_state_mib']:,.1f} / {row['counted_state_mib']:,.1f}" \
        if _known(row["counted_state_mib"]) else ""
    return [row["strategy"], _ms(row["predicted_step_s"]), measured,
            f"{row['error']:+.0%}" if _known(row["error"]) else "", str(row["repeats"]),
            f"{row['predicted_peak_mib']:,.0f}",
            f"{row['measured_peak_mib']:,.0f}" if _known(row["measured_peak_mib"]) else "", state,
            gap_words(row["ledger_gap_s"]) if row["ledger_gap_s"] else "no traced step"]


def answer_text(summary: dict, plan: dict, rows: list[dict], measured: bool) -> str:
    """summary.md of a tune: what was measured and why the rounds stopped, first; then the tiers, each candidate's
    prediction beside its measurement, the rounds, what was ruled out, and what the calibration (and, where
    `measured`, the measured rows) are for."""
    cluster = plan["cluster"]
    where = Placement(cluster["nproc"], cluster["nodes"], cluster["emulated"], cluster["link_mbit"]).words()
    if cluster["device"] == "cuda":
        where = f"{cluster['nodes']} node(s) of {cluster['gpus_per_node']} {cluster['gpu']} GPUs"
    runs = sum(row["repeats"] for row in rows)
    wall = f" in {minutes(plan['wall_s'])}" if plan.get("wall_s") else ""
    versions = ", ".join(f"{k} {v}" for k, v in sorted((summary.get("versions") or {}).items()) if v)
    table = [table_row(row) for row in rows]
    peak = "allocated on the GPU" if cluster["device"] == "cuda" else \
        "the process's resident memory, the runtime included (the prediction counts the model's tensors alone)"
    budget_words = "left out for the budget; a larger --budget measures it"
    ruled = {**dict.fromkeys(plan.get("left_for_budget", []), budget_words), **plan["ruled_out"]}
    return "\n".join([
        f"# gpt2dist tune: {where}, preset {plan['preset']}'s model"
        + (f" at {plan['size']}" if plan.get("size") else "") + f" in {plan['precision']}", "",
        f"Hardware: {summary['hardware']}. Software: {versions}.", "",
        f"Measured {len(rows)} candidates in {runs} undisturbed runs{wall} of a {minutes(plan['budget_s'])} budget; "
        f"the rounds stopped {stop_words(summary, plan)}.", "",
        warnings_markdown(summary),
        answer_markdown(summary["answer"]).rstrip().replace(
            "(see 'Where the time goes')", "(see 'Where the time goes' in its study's results/summary.md)"), "",
        "## Predicted beside measured", "",
        f"The planner's step ({plan['model']}) beside the measured median step (geometric mean over the undisturbed "
        f"repeats, 95% interval); error = predicted / measured - 1. The planner cannot tell two splits apart within "
        f"{plan['ratio_error']:.0%}, its error on the ratio of two runs. Peak memory: predicted, and measured as "
        f"{peak}; model state: predicted / counted on rank 0. Where the gap lies: the traced step's time ledger "
        "against the prediction's terms (a pipeline's bubble counts as exposed communication), the parts that make "
        "most of it.", "",
        tabulate(table, headers=["candidate", "predicted ms", "measured ms (95% interval)", "error", "runs",
                                 "predicted peak MiB", "measured peak MiB", "model state MiB", "where the gap lies"],
                 tablefmt="github", disable_numparse=True), "",
        "Why each was measured: " + "; ".join(f"{row['strategy']}, {row['why']}" for row in rows) + ".", "",
        "## The rounds", "", *rounds_markdown(summary, plan), "",
        "## Ruled out without running", "",
        *([f"- {name}: {why}" for name, why in ruled.items()] or ["- nothing"]), "",
        "## Calibration", "",
        "calibration.json holds each measured split's measured over predicted step, and their geometric mean for the "
        "splits not measured: `gpt2dist recommend --calibration calibration.json` prints the planner's prediction "
        "corrected by them, for this cluster or a larger one (which extrapolates the ratios, as it says)."
        + (f" {TUNE_MEASURED} holds the measured splits as rows of the table the GPU step model is judged on: "
           f"`gpt2dist validate-published --add {TUNE_MEASURED}` predicts them with the constants fitted to every "
           "other source, the model's error and its pick on this cluster out of sample."
           if measured else ""), ""])


def write_answer(results: Path, answer: Path, calibration: Path, measured: Path) -> list[str]:
    """The tune's answer, calibration and (on GPUs) measured rows from `results` (its study's summary.json and
    tune.json); returns the lines a terminal shows of it."""
    summary, plan = read_summary(results), read_plan(results)
    rows = beside(summary, plan)
    table = measured_rows(plan, summary, rows)
    atomic_write_text(answer, answer_text(summary, plan, rows, table is not None))
    atomic_write_json(calibration, calibration_of(plan, summary, rows))
    head = [line for line in answer_markdown(summary["answer"]).splitlines()[2:] if line][:1]
    written = [answer, calibration]
    if table is not None:
        atomic_write_text(measured, table.to_csv(index=False))
        written.append(measured)
    return [*head, f"The rounds stopped {stop_words(summary, plan)}.", f"ok: {', '.join(map(str, written))}"]

