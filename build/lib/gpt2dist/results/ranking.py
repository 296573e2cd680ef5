"""The study's answer: at each placement (process count, nodes, link), the configurations ranked by
throughput, each with its throughput over the fastest one's, paired by repeat round, and whether that
gap stands out from the run-to-run noise. It opens summary.md, before any table."""

from __future__ import annotations

import math

import pandas as pd

from gpt2dist.results.statistics import paired_ratio, ratio_text, verdict
from gpt2dist.results.time_ledger import why_slower, why_text

PLACEMENT = ["nproc", "nodes", "emulated", "link_mbit"]


def _placement(row: dict) -> str:
    processes = f"{row['nproc']} process{'es' if row['nproc'] > 1 else ''}"
    nodes = row.get("nodes") or 1
    if nodes == 1:
        return f"{processes} on one machine"
    if not row.get("emulated", True):  # summaries from before a cluster's nodes: every spread was emulated
        return f"{processes} on {nodes} nodes"
    link = row.get("link_mbit")
    shaped = "unshaped links" if link is None or (isinstance(link, float) and math.isnan(link)) else f"{link:g} Mbit/s"
    return f"{processes} on {nodes} emulated nodes, {shaped}"


def rank(runs: pd.DataFrame, summary: pd.DataFrame) -> list[dict]:
    """One entry per placement, fastest configuration first. Each configuration's ratio to the fastest uses
    only repeat rounds where both ran undisturbed; `gap` says 'fastest', 'slower' (interval below 1),
    'not distinguishable', 'too few repeats' or 'only disturbed runs'."""
    quiet = runs[runs["disturbed"].fillna("") == ""]

    def rounds(config: str) -> pd.Series:
        return quiet[quiet["config_id"] == config].set_index("repeat")["tokens_per_s"]

    def against(row: dict, best: dict) -> dict:
        value, low, high, pairs = paired_ratio(rounds(row["config_id"]), rounds(best["config_id"]))
        gap = "only disturbed runs" if row["from_disturbed"] or best["from_disturbed"] else verdict(low, high, pairs)
        return {"vs_fastest": value, "vs_fastest_ci_low": low, "vs_fastest_ci_high": high, "gap": gap}

    overall = summary.sort_values("tokens_per_s", ascending=False).iloc[0].to_dict()
    columns = [c for c in PLACEMENT if c in summary]
    groups = summary.groupby(columns, dropna=False, sort=True)
    answer = []
    for _, group in groups:
        ordered = group.sort_values("tokens_per_s", ascending=False).to_dict("records")
        best = ordered[0]
        rows = []
        for row in ordered:
            entry = {"config_id": row["config_id"], "strategy": row["strategy"], "precision": row["precision"],
                     "tokens_per_s": row["tokens_per_s"], "tokens_per_s_ci_low": row["tokens_per_s_ci_low"],
                     "tokens_per_s_ci_high": row["tokens_per_s_ci_high"], "repeats": row["repeats"]}
            if row is best:
                entry |= {"vs_fastest": 1.0, "vs_fastest_ci_low": 1.0, "vs_fastest_ci_high": 1.0, "gap": "fastest"}
            else:
                entry |= against(row, best) | {"ledger_gap_s": why_slower(row, best)}
            rows.append({key: _json_safe(value) for key, value in entry.items()})
        # the placement's best against the study's fastest: does adding processes pay at all?
        versus = None if best["config_id"] == overall["config_id"] else {
            "config_id": overall["config_id"], **{k: _json_safe(v) for k, v in against(best, overall).items()}}
        answer.append({"placement": _placement(best), "nproc": int(best["nproc"]), "ranked": rows,
                       "vs_study_fastest": versus})
    return answer


def _json_safe(value):
    """NaN (no interval) as null, numpy scalars as Python numbers: summary.json stays valid JSON."""
    if hasattr(value, "item"):
        value = value.item()
    return None if isinstance(value, float) and math.isnan(value) else value


def _nan(value) -> float:
    return math.nan if value is None else value


def _ratio(row: dict) -> str:
    return ratio_text(*(_nan(row[key]) for key in ("vs_fastest", "vs_fastest_ci_low", "vs_fastest_ci_high")))


def _tokens(row: dict) -> str:
    low, high = row["tokens_per_s_ci_low"], row["tokens_per_s_ci_high"]
    if low is None or high is None:
        return f"{row['tokens_per_s']:,.0f} tokens/s (one undisturbed run, no interval)"
    return f"{row['tokens_per_s']:,.0f} tokens/s ({low:,.0f} to {high:,.0f})"


GAP_WORDS = {
    "slower": "slower, beyond the noise",
    "fastest": "the same configuration",
    "not distinguishable": "not distinguishable from it (the interval includes 1)",
    "too few repeats": "too few undisturbed repeats to tell; run more",
    "only disturbed runs": "measured only on a disturbed machine; re-run it quietly",
    "faster": "faster round by round though slower on average: the order is noise",
}


def answer_markdown(answer: list[dict]) -> str:
    """'The answer' section: per placement, the fastest configuration, then each other one's share of it."""
    lines = ["## The answer", ""]
    for group in answer:
        best, *others = group["ranked"]
        versus = group.get("vs_study_fastest")
        beside = "" if versus is None else (
            f" That is {_ratio(versus)} of the study's fastest, {versus['config_id']}: {GAP_WORDS[versus['gap']]}.")
        lines.append(f"**{group['placement']}**: fastest is **{best['strategy']} {best['precision']}** at "
                     f"{_tokens(best)}.{beside}")
        for row in others:
            why = why_text(row.get("ledger_gap_s") or {})
            lines.append(f"- {row['strategy']} {row['precision']}: {_ratio(row)} of it, {GAP_WORDS[row['gap']]}"
                         + (f"; per step it spends {why} more than the fastest" if why else ""))
        lines.append("")
    lines.append("Ratios pair each repeat round with the same round of the fastest configuration (95% intervals, "
                 "undisturbed runs only)."
                 + (" The time a slower configuration spends per step comes from the traced steps' ledger "
                    "(see 'Where the time goes')." if any(row.get("ledger_gap_s") for group in answer
                                                        for row in group["ranked"]) else ""))
    return "\n".join(lines) + "\n"
