"""The two seed studies' claims, checked against this study's data.

Each claim is data: where it comes from, what it says, and a check that reads the per-run
and per-configuration tables and returns a verdict with the statistic behind it:
supported, contradicted, not distinguishable from noise, or not testable here (and why).
Checks read only undisturbed runs (collect's summary already leaves disturbed ones out; a
configuration summarised from disturbed runs alone makes its claims untestable), so a busy
machine can never turn a claim "supported".
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd

from gpt2dist.config.configuration import config_id
from gpt2dist.config.placement import Kind, Placement
from gpt2dist.config.sizes import size_words
from gpt2dist.config.methods import BAI, PATWARDHAN
from gpt2dist.config.strategies import called, describe, REFERENCE
from gpt2dist.forecast.link_model import worst_error
from gpt2dist.results.statistics import log_interval, paired_ratio, ratio_text, verdict

SUPPORTED, CONTRADICTED = "supported", "contradicted"
NOISE, UNTESTABLE = "not distinguishable from noise", "not testable here"
APEX = ("apex-O1", "apex-O2")
SAME_LOSS_TOLERANCE = 0.01  # relative difference of final validation loss that still counts as "the same loss"
MODEL_TOLERANCE = 0.25  # the link model "explains" a slow-down when it predicts every step time within this
# The papers' strategies in their own words; config.strategies says which of ours each one is.
DP, DDP, HOROVOD = (called(BAI, name) for name in ("Single Parameter Server", "Distributed Parameter Server", "Horovod"))
DDP_APEX = called(BAI, "Distributed Parameter Server + Apex")
FSDP, TP = called(PATWARDHAN, "FSDP"), called(PATWARDHAN, "tensor parallelism")


@dataclass(frozen=True)
class Finding:
    verdict: str
    statistic: str


class Tables:
    """The collected tables, with the lookups the checks share. `summary` holds the one-machine
    configurations (the one-node claims' rivals), `spread` those on emulated nodes, `across` those on a
    cluster's nodes."""

    def __init__(self, runs: pd.DataFrame, summary: pd.DataFrame, link_model: pd.DataFrame | None = None,
                 size: str | None = None):
        self.size = size  # the model size these tables hold, in a study of sizes (None: the preset's model)
        self.trained = runs  # every run: load slows a run, it does not change what it learns
        self.runs = runs[runs["disturbed"].fillna("") == ""]  # the runs whose timings count
        self.everything = summary.set_index("config_id")
        kinds = pd.Series([Placement.of(row).kind for row in summary.to_dict("records")], index=self.everything.index,
                          dtype=object)
        self.summary = self.everything[kinds == Kind.ONE_MACHINE]
        self.spread = self.everything[kinds == Kind.EMULATED]
        self.across = self.everything[kinds == Kind.CLUSTER]
        self.link_model = link_model if link_model is not None else pd.DataFrame()

    def id(self, strategy: str, precision: str, nproc: int) -> str:
        """A configuration of these tables' model size on one machine, by its parts."""
        return config_id(strategy, precision, nproc, size=self.size)

    def usable(self, config: str) -> bool:
        return config in self.everything.index and not bool(self.everything.loc[config, "from_disturbed"])

    def per_round(self, config: str) -> pd.Series:
        """Per round, the throughput of the undisturbed runs."""
        return _by_round(self.runs, config, "tokens_per_s")

    def final_losses(self, config: str) -> pd.Series:
        """Per round, the final validation loss of every run, disturbed or not."""
        return _by_round(self.trained, config, "final_val_loss")

    def ratio(self, a: str, b: str) -> tuple[float, float, float, str]:
        """a's throughput over b's, paired by repeat round, and whether a is faster/slower/neither."""
        value, low, high, pairs = paired_ratio(self.per_round(a), self.per_round(b))
        return value, low, high, verdict(low, high, pairs)

    def one_node_max(self) -> int:
        """The most processes a one-machine configuration has: 0 where the study has none (a tune's on nodes)."""
        return int(self.summary["nproc"].max()) if len(self.summary) else 0


def _by_round(runs: pd.DataFrame, config: str, column: str) -> pd.Series:
    return runs[runs["config_id"] == config].set_index("repeat")[column]


def _untestable(why: str) -> Finding:
    return Finding(UNTESTABLE, why)


def _fastest(t: Tables, favourite: str, rivals: list[str]) -> Finding:
    """favourite faster than every rival (paired): supported; some rival faster: contradicted."""
    rivals = [r for r in rivals if r != favourite]
    blind = [c for c in (favourite, *rivals) if c in t.summary.index and not t.usable(c)]
    if blind:  # a rival measured only while disturbed could not be compared: no verdict without it
        return _untestable(f"only disturbed runs of {', '.join(blind)}")
    if favourite not in t.summary.index or not rivals:
        return _untestable(f"needs {favourite} and a rival at the same process count")
    parts, verdicts = [], []
    for rival in rivals:
        value, low, high, which = t.ratio(favourite, rival)
        parts.append(f"{favourite}/{rival} = {ratio_text(value, low, high)}")
        verdicts.append(which)
    statistic = "; ".join(parts)
    if "slower" in verdicts:
        return Finding(CONTRADICTED, statistic)
    if all(v == "faster" for v in verdicts):
        return Finding(SUPPORTED, statistic)
    return Finding(NOISE, statistic)


def _data_parallel(strategies: pd.Series) -> pd.Series:
    return strategies.map(lambda name: describe(name).data_parallel).astype(bool)


def _configs(t: Tables, precisions, nproc: int) -> list[str]:
    """Data-parallel configurations at `nproc` in these precisions: Bai 2022's rivals."""
    s = t.summary
    chosen = s[s["precision"].isin(precisions) & (s["nproc"] == nproc) & _data_parallel(s["strategy"])]
    return list(chosen.index)


def _ddp_with_apex(t: Tables, n: int) -> list[str]:
    """DDP + Apex runs at n: Bai's own (Apex's DDP wrapper with O2) first, then torch DDP with amp."""
    return [c for prefix in (f"{DDP_APEX}-", f"{DDP}-") for c in _configs(t, APEX, n) if c.startswith(prefix)]


def ddp_apex_fastest(t: Tables) -> Finding:
    n = t.one_node_max()
    apex = _ddp_with_apex(t, n)
    if not apex:
        return _untestable("the study has no DDP + Apex run (Apex needs CUDA GPUs)")
    others = [c for c in _configs(t, t.summary["precision"].unique(), n) if c not in apex]
    return _fastest(t, apex[0], others)


def ddp_fastest_without_apex(t: Tables) -> Finding:
    n = t.one_node_max()
    if n < 2:
        return _untestable("the study has no multi-process runs")
    return _fastest(t, t.id(DDP, "fp32", n), _configs(t, ["fp32"], n))


def apex_multiplies_horovod(t: Tables) -> Finding:
    n = t.one_node_max()
    ddp_apex = next((c for c in _ddp_with_apex(t, n) if t.usable(c)), t.id(DDP, "apex-O1", n))
    pairs = {HOROVOD: (t.id(HOROVOD, "apex-O1", n), t.id(HOROVOD, "fp32", n)), DDP: (ddp_apex, t.id(DDP, "fp32", n))}
    if not all(t.usable(a) and t.usable(b) for a, b in pairs.values()):
        return _untestable(f"needs {HOROVOD} and {DDP} at n={n} with Apex and in fp32 (Apex needs CUDA GPUs)")
    gains = {s: t.ratio(a, b) for s, (a, b) in pairs.items()}
    statistic = "; ".join(f"{s} apex/fp32 = {ratio_text(g[0], g[1], g[2])}" for s, g in gains.items())
    horovod, ddp = gains[HOROVOD], gains[DDP]
    if any(math.isnan(x) for x in (horovod[1], ddp[2])):
        return Finding(NOISE, statistic + " (too few repeats)")
    if horovod[1] > ddp[2]:
        return Finding(SUPPORTED, statistic)
    if horovod[2] < ddp[1]:
        return Finding(CONTRADICTED, statistic)
    return Finding(NOISE, statistic)


def dp_slower_than_ddp(t: Tables) -> Finding:
    n = t.one_node_max()
    dp, ddp = t.id(DP, "fp32", n), t.id(DDP, "fp32", n)
    if n < 2 or not (t.usable(dp) and t.usable(ddp)):
        return _untestable(f"needs {DP} and {DDP} at n={n}, fp32")
    if t.runs.loc[t.runs["config_id"] == dp, "backend"].fillna("none").eq("none").all():
        return _untestable("DataParallel without CUDA runs on one device, so it cannot be slower for DDP's reasons")
    value, low, high, which = t.ratio(dp, ddp)
    statistic = f"{dp}/{ddp} = {ratio_text(value, low, high)}"
    return Finding({"slower": SUPPORTED, "faster": CONTRADICTED}.get(which, NOISE), statistic)


def _on_links(t: Tables) -> pd.DataFrame:
    if t.spread.empty or t.spread["link_mbit"].isna().all():
        return t.spread.iloc[:0]
    return t.spread.dropna(subset=["link_mbit"])


LINKS_NEEDED = "needs runs on emulated nodes' shaped links (preset two-node-cpu, as root)"
SHARED_CORES = "emulated nodes share this machine's cores, so only what the link costs is tested"


def _kept_on_slowest_link(t: Tables) -> tuple[float, dict[str, pd.Series]]:
    """Per configuration on the slowest link: its throughput over the same configuration's on one
    machine, per repeat round."""
    links = _on_links(t)
    slowest = links["link_mbit"].min()
    kept = {}
    for config, row in links[links["link_mbit"] == slowest].iterrows():
        one_machine = t.id(row["strategy"], row["precision"], row["nproc"])
        if t.usable(config) and t.usable(one_machine):
            kept[config] = t.per_round(config) / t.per_round(one_machine)
    return slowest, kept


def _kept_across_nodes(t: Tables) -> dict[str, pd.Series]:
    """Per configuration on a cluster's nodes: its throughput over (nodes x) the same configuration's on one
    node with as many processes per node, per repeat round: the node-scaling efficiency."""
    kept = {}
    for config, row in t.across.iterrows():
        baseline = row.get("baseline")
        if isinstance(baseline, str) and t.usable(config) and t.usable(baseline):
            kept[config] = t.per_round(config) / t.per_round(baseline) / row["nodes"]
    return kept


def horovod_most_robust(t: Tables) -> Finding:
    """Horovod keeps more of its one-node throughput across nodes than every other data-parallel strategy,
    paired by round; with Apex where the study has it. On a cluster's nodes where the study has them (what
    each node adds), else on emulated nodes' slowest link (Apex needs CUDA, emulated nodes run on CPU)."""
    if not t.across.empty:
        kept, where = _kept_across_nodes(t), "across a cluster's nodes (throughput over nodes x one node's)"
    elif not _on_links(t).empty:
        slowest, kept = _kept_on_slowest_link(t)
        where = f"on emulated nodes at {slowest:g} Mbit/s against one machine"
    else:
        return _untestable(LINKS_NEEDED)
    name = {c: f"{t.everything.loc[c, 'strategy']} {t.everything.loc[c, 'precision']}" for c in kept}
    strategy = {c: t.everything.loc[c, "strategy"] for c in kept}
    horovod = sorted((c for c in kept if strategy[c] == HOROVOD), key=lambda c: "apex" not in c)
    rivals = [c for c in kept if strategy[c] != HOROVOD and describe(strategy[c]).data_parallel]
    if not horovod or not rivals:
        return _untestable(f"needs undisturbed {HOROVOD} runs and another data-parallel strategy's across nodes "
                           "and on one node")
    favourite = horovod[0]
    shares = "; ".join(f"{name[c]} {log_interval(kept[c])[0]:.2f}" for c in [favourite, *rivals])
    parts, verdicts = [], []
    for rival in rivals:
        value, low, high, pairs = paired_ratio(kept[favourite], kept[rival])
        parts.append(f"{name[favourite]}/{name[rival]} = {ratio_text(value, low, high)}")
        verdicts.append(verdict(low, high, pairs))
    statistic = f"throughput kept {where}: {shares}; ratios of what is kept: " + "; ".join(parts)
    if "apex" not in favourite:  # the claim is about Horovod with Apex: runs without it cannot judge it
        return _untestable(f"no {HOROVOD} run with Apex (Apex needs CUDA GPUs); without Apex, {statistic}")
    if "slower" in verdicts:
        return Finding(CONTRADICTED, statistic)
    if all(v == "faster" for v in verdicts):
        return Finding(SUPPORTED, statistic)
    return Finding(NOISE, statistic)


def _sublinear_across_nodes(t: Tables) -> Finding:
    """On a cluster's nodes: each configuration's speedup over one node stays below the node count."""
    kept = _kept_across_nodes(t)
    if not kept:
        return _untestable("needs undisturbed runs across a cluster's nodes and of the same strategy on one node")
    parts, verdicts = [], []
    for config, efficiency in kept.items():
        value, low, high = log_interval(efficiency)
        parts.append(f"{config} {ratio_text(value, low, high)} of linear")
        verdicts.append("slower" if high < 1 else "faster" if low > 1 else "neither")
    statistic = f"node-scaling efficiency (speedup over one node / nodes) across a cluster's nodes: {'; '.join(parts)}"
    if "faster" in verdicts:
        return Finding(CONTRADICTED, statistic)
    if all(v == "slower" for v in verdicts):
        return Finding(SUPPORTED, statistic)
    return Finding(NOISE, statistic)


def communication_makes_nodes_sublinear(t: Tables) -> Finding:
    """Across a cluster's nodes where the study has them: sublinear speedup over one node. Else, on emulated
    nodes: throughput falls as the link narrows, by about what the link model's communication time says."""
    if not t.across.empty:
        return _sublinear_across_nodes(t)
    links = _on_links(t)
    if links.empty:
        return _untestable(LINKS_NEEDED)
    fastest, slowest = links["link_mbit"].max(), links["link_mbit"].min()
    if fastest == slowest:
        return _untestable("needs two or more link bandwidths")
    parts, verdicts = [], []
    for (strategy, precision, nproc), group in links.groupby(["strategy", "precision", "nproc"]):
        wide, narrow = (group.index[group["link_mbit"] == rate][0] for rate in (fastest, slowest))
        if not (t.usable(wide) and t.usable(narrow)):
            continue
        value, low, high, pairs = paired_ratio(t.per_round(narrow), t.per_round(wide))
        parts.append(f"{strategy} {precision} {slowest:g}/{fastest:g} Mbit/s = {ratio_text(value, low, high)}")
        verdicts.append(verdict(low, high, pairs))
    if not parts:
        return _untestable("no configuration has undisturbed runs at both the fastest and the slowest link")
    worst = worst_error(t.link_model)
    statistic = (f"on emulated nodes, throughput on the slowest over the fastest link: {'; '.join(parts)}; link "
                 f"model's worst error {worst:.0%}; {SHARED_CORES}")
    if "faster" in verdicts:
        return Finding(CONTRADICTED, statistic)
    if all(v == "slower" for v in verdicts) and worst <= MODEL_TOLERANCE:
        return Finding(SUPPORTED, statistic)
    return Finding(NOISE, statistic)


def fsdp_least_memory(t: Tables) -> Finding:
    s = t.summary
    n = t.one_node_max()
    if n < 2:  # one rank holds the whole model: FSDP has nothing to shard, and the claim is about sharding
        return _untestable("needs FSDP on 2 or more processes of one machine (one rank holds every parameter)")
    fsdp = [c for c in s.index[(s["strategy"] == FSDP) & (s["nproc"] == n)] if t.usable(c)]
    if not fsdp or s["model_state_bytes"].isna().any():
        return _untestable(f"needs FSDP at n={n} and every run's model-state bytes")
    sharded = s["strategy"].map(lambda name: describe(name).shards_state).astype(bool)  # FSDP, alone or with TP
    others = s[(s["nproc"] == n) & ~sharded]
    if others.empty:
        return _untestable(f"needs another strategy at n={n}")
    fsdp_most = s.loc[fsdp, "model_state_bytes"].max()
    others_least = others["model_state_bytes"].min()
    statistic = (f"model state per rank: FSDP {fsdp_most / 2**20:,.1f} MiB, the least of the others "
                 f"{others_least / 2**20:,.1f} MiB ({others['model_state_bytes'].idxmin()}); "
                 "counted from the tensors, without noise")
    return Finding(SUPPORTED if fsdp_most < others_least else CONTRADICTED, statistic)


def same_loss(t: Tables) -> Finding:
    s = t.everything
    worst, where = -1.0, None
    for config, row in s.iterrows():
        reference = t.id(REFERENCE, row["precision"], 1)
        if config == reference or reference not in s.index:
            continue
        mine, theirs = t.final_losses(config), t.final_losses(reference)
        rounds = mine.dropna().index.intersection(theirs.dropna().index)
        for r in rounds:  # the same round trains from the same seed and data order
            difference = abs(mine[r] - theirs[r]) / theirs[r]
            if difference > worst:
                worst, where = difference, f"{config} r{r}"
    if where is None:
        return _untestable("needs single and another strategy at the same precision with validation losses")
    statistic = f"largest relative difference from single's final validation loss: {worst:.2e} ({where})"
    return Finding(SUPPORTED if worst <= SAME_LOSS_TOLERANCE else CONTRADICTED, statistic)


def ddp_between_single_and_fsdp(t: Tables) -> Finding:
    n = t.one_node_max()
    ddp, fsdp, single = t.id(DDP, "fp32", n), t.id(FSDP, "fp32", n), t.id(REFERENCE, "fp32", 1)
    if n < 2 or not all(t.usable(c) for c in (ddp, fsdp, single)):
        return _untestable(f"needs {REFERENCE}, {DDP} and {FSDP} in fp32 ({DDP} and {FSDP} at n={n})")
    over_single, over_fsdp = t.ratio(ddp, single), t.ratio(ddp, fsdp)
    statistic = (f"{DDP}/{REFERENCE} = {ratio_text(over_single[0], over_single[1], over_single[2])}; "
                 f"{DDP}/{FSDP} = {ratio_text(over_fsdp[0], over_fsdp[1], over_fsdp[2])}")
    if {over_single[3], over_fsdp[3]} == {"faster", "slower"}:
        return Finding(SUPPORTED, statistic)
    if over_single[3] == over_fsdp[3] and over_single[3] in ("faster", "slower"):
        return Finding(CONTRADICTED, statistic)
    return Finding(NOISE, statistic)


def tp_trades_throughput_for_memory(t: Tables) -> Finding:
    """tp against ddp at the same precision and the most processes both have."""
    s = t.summary
    pairs = [(t.id(TP, p, n), t.id(DDP, p, n)) for n in sorted(s["nproc"].unique(), reverse=True)
             for p in s["precision"].unique()]
    usable = [(tp, ddp) for tp, ddp in pairs if t.usable(tp) and t.usable(ddp)]
    if not usable:
        return _untestable(f"needs {TP} and {DDP} at the same precision and process count, undisturbed")
    tp, ddp = usable[0]
    memory = s.loc[tp, "model_state_bytes"] / s.loc[ddp, "model_state_bytes"]
    value, low, high, which = t.ratio(tp, ddp)
    statistic = (f"model state per rank {tp}/{ddp} = {memory:.2f} (from the tensors); "
                 f"throughput {tp}/{ddp} = {ratio_text(value, low, high)}")
    if memory < 1 and which == "slower":
        return Finding(SUPPORTED, statistic)
    if memory >= 1 or which == "faster":
        return Finding(CONTRADICTED, statistic)
    return Finding(NOISE, statistic)


@dataclass(frozen=True)
class Claim:
    key: str
    source: str
    text: str
    check: Callable[[Tables], Finding]


CLAIMS = [
    Claim("bai-ddp-apex-fastest", "Bai 2022", "DDP with Apex mixed precision is the fastest strategy on one node.",
          ddp_apex_fastest),
    Claim("bai-horovod-apex-robust", "Bai 2022", "Horovod with Apex is the most robust across nodes.",
          horovod_most_robust),
    Claim("bai-ddp-fastest-fp32", "Bai 2022", "Without Apex, DDP is the fastest strategy on one node.",
          ddp_fastest_without_apex),
    Claim("bai-apex-horovod-gain", "Bai 2022 (code README)",
          "Apex multiplies Horovod's throughput (about 3x) but helps DDP only a little.", apex_multiplies_horovod),
    Claim("bai-dp-slower", "Bai 2022", "DataParallel (single parameter server) is slower than DDP.",
          dp_slower_than_ddp),
    Claim("bai-sublinear-nodes", "Bai 2022", "Across nodes the speedup is sublinear because of communication.",
          communication_makes_nodes_sublinear),
    Claim("patwardhan-fsdp-memory", "Patwardhan et al. 2024", "FSDP uses the least memory per device.",
          fsdp_least_memory),
    Claim("patwardhan-same-loss", "Patwardhan et al. 2024", "Every strategy converges to the same loss.", same_loss),
    Claim("patwardhan-ddp-between", "Patwardhan et al. 2024",
          "DDP's throughput lies between single-GPU training's and FSDP's.", ddp_between_single_and_fsdp),
    Claim("patwardhan-tp-memory", "Patwardhan et al. 2024",
          "Tensor parallelism lowers per-device memory at a throughput cost (against DDP).",
          tp_trades_throughput_for_memory),
]


def check_claims(runs: pd.DataFrame, summary: pd.DataFrame, link_model: pd.DataFrame | None = None) -> list[dict]:
    """Every claim's verdict; in a study of model sizes, every claim at each size, from that size's runs alone
    (its key names the size, so stored studies are compared size by size)."""
    if "size" not in summary:
        return _judged(Tables(runs, summary, link_model))
    results = []
    for size, part in summary.groupby("size", sort=False):
        links = link_model[link_model["config_id"].isin(part["config_id"])] if link_model is not None else None
        results += [finding | {"claim": f"{finding['claim']}@{size}", "text": f"{size_words(size)}: {finding['text']}"}
                    for finding in _judged(Tables(runs[runs["size"] == size], part, links, size))]
    return results


def _judged(tables: Tables) -> list[dict]:
    results = []
    for claim in CLAIMS:
        finding = claim.check(tables)
        results.append({"claim": claim.key, "source": claim.source, "text": claim.text,
                        "verdict": finding.verdict, "statistic": finding.statistic})
    return results
