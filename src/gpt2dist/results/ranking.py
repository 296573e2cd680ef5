"""The study's answer: at each placement (process count, nodes, link), the configurations in tiers by
throughput. Tier 1 is the top configuration and every one that cannot be told apart from it; tier 2
starts at the fastest of the rest, and so on. Each comparison is a ratio paired by repeat round whose
interval is widened for the number of comparisons in the placement (Bonferroni), so a placement of ten
configurations does not find a "fastest" by chance. A single fastest is named only when tier 1 holds one
configuration. It opens summary.md, before any table."""

from __future__ import annotations

import math

import pandas as pd

from gpt2dist.config.configuration import configuration_name
from gpt2dist.config.placement import Placement
from gpt2dist.config.sizes import size_words
from gpt2dist.config.strategies import describe, REFERENCE
from gpt2dist.results.statistics import LEVEL, paired_ratio, ratio_text, verdict
from gpt2dist.results.time_ledger import why_slower, why_text

PLACEMENT = ["size", "nproc", "nodes", "emulated", "link_mbit"]  # size: where a study trains sizes of its own
SAME_TIER = {"not distinguishable", "faster"}  # "faster": ahead round by round though behind on average


def rank(runs: pd.DataFrame, summary: pd.DataFrame) -> list[dict]:
    """One entry per placement, fastest configuration first, each with its `tier` (None: too few undisturbed
    repeats to place it) and its ratio to the placement's top. `gap` says 'fastest', 'slower' (interval below
    1), 'not distinguishable', 'too few repeats', 'one repeat planned' or 'only disturbed runs'; intervals are at
    the placement's Bonferroni-corrected `level`."""
    quiet = runs[runs["disturbed"].fillna("") == ""]

    def rounds(config: str) -> pd.Series:
        return quiet[quiet["config_id"] == config].set_index("repeat")["tokens_per_s"]

    def against(row: dict, best: dict, level: float = LEVEL) -> dict:
        value, low, high, pairs = paired_ratio(rounds(row["config_id"]), rounds(best["config_id"]), level)
        gap = "only disturbed runs" if row["from_disturbed"] or best["from_disturbed"] else verdict(low, high, pairs)
        if gap == "too few repeats" and min(row.get("planned_repeats") or 2, best.get("planned_repeats") or 2) == 1:
            gap = "one repeat planned"  # not the machine's fault: the study asked for one
        return {"vs_fastest": value, "vs_fastest_ci_low": low, "vs_fastest_ci_high": high, "gap": gap, "pairs": pairs}

    fastest = summary.sort_values("tokens_per_s", ascending=False)
    columns = [c for c in PLACEMENT if c in summary]
    if "size" in summary:  # sizes in the study's order (the summary's), not by name
        order = {size: i for i, size in enumerate(dict.fromkeys(summary["size"]))}
        summary, columns = summary.assign(_size=summary["size"].map(order)), ["_size", *columns[1:]]
    groups = summary.groupby(columns, dropna=False, sort=True)
    answer = []
    for _, group in groups:
        ordered = group.sort_values("tokens_per_s", ascending=False).to_dict("records")
        # a wrapper of single's computation (dp at one process) is no rival of single's: never the placement's top
        best = next((row for row in ordered if not same_computation(row, ordered)), ordered[0])
        ordered = [best, *(row for row in ordered if row is not best)]
        level = 1 - (1 - LEVEL) / max(1, len(ordered) - 1)
        tier_of = tiers(ordered, lambda row, anchor: against(row, anchor, level)["gap"])
        rows = []
        for row in ordered:
            entry = {"config_id": row["config_id"], "strategy": row["strategy"], "precision": row["precision"],
                     "tokens_per_s": row["tokens_per_s"], "tokens_per_s_ci_low": row["tokens_per_s_ci_low"],
                     "tokens_per_s_ci_high": row["tokens_per_s_ci_high"], "repeats": row["repeats"],
                     "tier": tier_of.get(row["config_id"]), "same_as": same_computation(row, ordered)}
            if row is best:
                entry |= {"vs_fastest": 1.0, "vs_fastest_ci_low": 1.0, "vs_fastest_ci_high": 1.0, "gap": "fastest"}
            else:
                entry |= against(row, best, level) | {"ledger_gap_s": why_slower(row, best)}
            rows.append({key: _json_safe(value) for key, value in entry.items()})
        # the placement's best against the study's fastest (at its size): does adding processes pay at all?
        candidates = (fastest[fastest["size"] == best["size"]] if "size" in fastest else fastest).to_dict("records")
        overall = next((row for row in candidates if not same_computation(row, candidates)), candidates[0])
        versus = None if best["config_id"] == overall["config_id"] else {
            "config_id": overall["config_id"], **{k: _json_safe(v) for k, v in against(best, overall).items()}}
        answer.append({"placement": Placement.of(best).words(), "nproc": int(best["nproc"]), "level": level,
                       "ranked": rows, "vs_study_fastest": versus,
                       **({"size": best["size"]} if "size" in best else {})})
    return answer


def tiers(ordered: list[dict], gap) -> dict[str, int]:
    """Tier per configuration (fastest first in `ordered`): each tier's top is the fastest one left, and holds
    every one left that `gap(row, top)` cannot tell apart from it; one that cannot be compared with a top
    (too few undisturbed repeats) gets no tier."""
    tier_of, left, tier = {}, [row for row in ordered if not row["from_disturbed"]], 0
    while left:
        top, tier = left[0], tier + 1
        tier_of[top["config_id"]] = tier
        verdicts = {row["config_id"]: gap(row, top) for row in left[1:]}
        tier_of |= {config: tier for config, said in verdicts.items() if said in SAME_TIER}
        left = [row for row in left[1:] if verdicts[row["config_id"]] == "slower"]
    return tier_of


def same_computation(row: dict, ordered: list[dict]) -> str | None:
    """The configuration this one computes exactly like, on the same device: a strategy whose one process
    drives every device (DataParallel), at one device, is single's computation in a wrapper."""
    if row["nproc"] != 1 or not describe(row["strategy"]).one_process or row["strategy"] == REFERENCE:
        return None
    twin = next((o for o in ordered if o["strategy"] == REFERENCE and o["precision"] == row["precision"]), None)
    return None if twin is None else twin["config_id"]


def _json_safe(value):
    """NaN (no interval) as null, numpy scalars as Python numbers: summary.json stays valid JSON."""
    if hasattr(value, "item"):
        value = value.item()
    return None if isinstance(value, float) and math.isnan(value) else value


def _nan(value) -> float:
    return math.nan if value is None else value


def _ratio(row: dict) -> str:
    if row["gap"] == "one repeat planned" and row["vs_fastest"] is not None:
        return f"{row['vs_fastest']:.2f} (one run each, no interval)"
    if row.get("pairs") == 2 and row["gap"] == "not distinguishable":  # one degree of freedom: t is in the tens
        return f"{row['vs_fastest']:.2f} (2 pairs of runs: too few for a useful interval at this level)"
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
    "one repeat planned": "run once, as the study plans it, so it cannot be placed (give its run group `repeats: 2` "
                          "or more to place it)",
    "only disturbed runs": "measured only on a disturbed machine; re-run it quietly",
    "faster": "faster round by round though slower on average: the order is noise",
}


def _gap_words(row: dict) -> str:
    """The verdict beside _ratio's numbers: where those said there is no useful interval, no word cites one."""
    if row.get("pairs") == 2 and row["gap"] == "not distinguishable":
        return "not distinguishable from it with 2 pairs (run more repeats to tell)"
    return GAP_WORDS[row["gap"]]


def _name(row: dict) -> str:
    return configuration_name(row["strategy"], row["precision"])


def _twin(row: dict) -> str:
    """What a configuration that computes as single does is, said wherever it is named: no rival of single's."""
    return f" ({REFERENCE} {row['precision']}'s computation, in DataParallel over one device)" if row.get("same_as") else ""


def _line(row: dict, best: dict) -> str:
    twin = _twin(row)
    gap = row.get("ledger_gap_s") or {}
    why = why_text(gap)
    if gap and not why:  # the ledger must not explain a gap its own steps do not show
        why = f"; its traced steps were not measurably slower than {_name(best)}'s (the gap lies outside them, or " \
              "in the noise)"
    elif why:
        why = f"; per step it spends {why} more than {_name(best)}"
    return f"- {_name(row)}{twin}: {_ratio(row)} of {_name(best)}, {_gap_words(row)}{why}"


def _fastest_words(group: dict) -> str:
    """What a placement's best is set against: the study's fastest, or in a study of sizes its size's."""
    return f"fastest at {size_words(group['size'])}" if group.get("size") else "study's fastest"


def answer_markdown(answer: list[dict]) -> str:
    """'The answer' section: per placement, its tiers (a single fastest only when it is beyond the noise of
    every other), each configuration's share of the top one's throughput, and what could not be placed."""
    lines = ["## The answer", ""]
    for group in answer:
        best, *others = group["ranked"]
        versus = group.get("vs_study_fastest")
        beside = "" if versus is None else (
            f" That is {_ratio(versus)} of the {_fastest_words(group)}, {versus['config_id']}: "
            f"{_gap_words(versus)}.")
        top = [row for row in group["ranked"] if row.get("tier") == 1]
        placed = [row for row in group["ranked"] if row.get("tier")]
        if not others:
            lines.append(f"**{group['placement']}**: {_name(best)} at {_tokens(best)}, the only configuration "
                         f"here.{beside}")
        elif len(top) == 1 and len(placed) > 1:
            lines.append(f"**{group['placement']}**: fastest is **{_name(best)}** at {_tokens(best)}, "
                         f"beyond the noise of every other configuration here.{beside}")
        elif len(top) > 1:
            names = ", ".join(_name(row) for row in top)
            # a wrapper of single's computation may average higher than single; it still does not head the tier
            head = "Highest on average" if best["tokens_per_s"] >= max(row["tokens_per_s"] for row in top) else \
                "At its head, as the computation that DataParallel over one device wraps"
            lines.append(f"**{group['placement']}**: the top tier holds {len(top)} configurations that cannot be "
                         f"told apart: {names}. {head}: {_name(best)} at {_tokens(best)}.{beside}")
        else:
            lines.append(f"**{group['placement']}**: {_name(best)} at {_tokens(best)}; nothing here can be placed "
                         f"against it.{beside}")
        tops = {}  # each tier's top: the first of it in throughput order
        for row in group["ranked"]:
            tops.setdefault(row.get("tier"), row)
        for tier in sorted({row["tier"] for row in others if row.get("tier")}):
            members = [row for row in others if row.get("tier") == tier]
            if tier > 1:  # its members are below the previous tier's top, not necessarily every member of it
                lines.append(f"- tier {tier}, slower than {_name(tops[tier - 1])} beyond the noise:")
            lines.extend(("  " if tier > 1 else "") + _line(row, best) for row in members)
        unplaced = [row for row in others if not row.get("tier")]
        if unplaced:
            lines.append("- not placed:")
            lines.extend("  " + _line(row, best) for row in unplaced)
        lines.append("")
    levels = sorted({group.get("level", LEVEL) for group in answer})
    lines.append("Ratios pair each repeat round with the same round of the placement's top configuration (undisturbed "
                 "runs only); their intervals are widened for the number of comparisons in the placement (Bonferroni: "
                 f"{', '.join(f'{level:.1%}' for level in levels)} each, so 95% for the placement as a whole)."
                 + (" The time a slower configuration spends per step comes from the traced steps' ledger "
                    "(see 'Where the time goes')." if any(row.get("ledger_gap_s") for group in answer
                                                        for row in group["ranked"]) else ""))
    return "\n".join(lines) + "\n"
