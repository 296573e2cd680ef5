"""What the forecasting commands say around their tables, worded here so that the commands only print it: `gpt2dist
plan` (what was planned and assumed, how memory and step time were predicted, the study's duration on GPUs, what
does not fit and what of the cluster the runs leave idle) and `gpt2dist recommend` (the ranking per model size, the
step-time model's error on stored studies, what it extrapolates beyond), `gpt2dist project-scaling` and `gpt2dist
validate-published`."""

from __future__ import annotations

import shlex
from dataclasses import replace
from pathlib import Path

import pandas as pd
from tabulate import tabulate

from gpt2dist.config.memory import USABLE_SHARE
from gpt2dist.config.schema import Preset
from gpt2dist.config.sizes import flops_per_token, parameter_count, size_words
from gpt2dist.config.strategies import STRATEGIES
from gpt2dist.errors import UsageError
from gpt2dist.pipeline.layout import PARAMS_FILE, SLURM_PROFILE
from gpt2dist.pipeline.study import model_of, Study
from gpt2dist.forecast.plan import duration_words, fit_lines, plan_text
from gpt2dist.forecast.link_model import projection
from gpt2dist.forecast.published import HIGH, LOW, SEARCH_TIE, TIE, WITHIN, published_summary, summary_words
from gpt2dist.forecast.recommend import extrapolations, recommend, verdict_line
from gpt2dist.forecast.shortlist import Cluster, predicted
from gpt2dist.forecast.tuned import TunedCalibration
from gpt2dist.system.hardware import gpu_memory_gb
from gpt2dist.system.links import Links, links_of


Part = tuple[str, str]  # ("prose", text to wrap to the terminal) or ("table", text printed as it is)
TOP = 12  # candidates `recommend` shows per model size, of the dozens it ranks


SHOWN = 5  # the wrongly ordered pairs a group names, and the searches missed the report names


def compute_words(gpu: str, mfu: float | None, calibration: dict | None = None) -> str:
    """How a GPU step's computation was priced: the GPU step model (calibrated on this GPU where it was), or an
    assumed MFU."""
    if mfu is not None:
        return f"compute at an assumed MFU of {mfu:.0%} of the {gpu}'s peak"
    said = (f"the GPU step model on the {gpu} (each operation at its roofline, launches and the host's dispatch, "
            "constants fitted to published runs)")
    for precision, timed in (calibration or {}).items():
        said += (f"; in {precision} its computation x {timed.scale:.3g} {timed.offset_s * 1e3:+.3g} ms a step, as "
                 f"single's steps timed on a {timed.gpu} {timed.timings_words()} said")
    return said


def plan_report(study: Study, table: pd.DataFrame, *, gpu: str, mfu: float | None, memory_gb: list[float],
                links: Links, duration: dict[str, float] | None, budget_s: float | None,
                calibration: dict | None = None) -> list[Part]:
    """What `gpt2dist plan` prints around its table: what was planned and assumed, the table (one per model size),
    how memory and step time were predicted, the study's duration on GPUs and what does not fit."""
    said: list[Part] = []
    on_gpus = study.device == "cuda"
    t, m = study.preset.train, study.preset.model
    each = f", {table['repeats'].iloc[0]} each" if table["repeats"].nunique() == 1 else ""
    said.append(("prose", f"Plan of preset {study.preset_name} ({len(study.runs)} runs of "
                          f"{table['config_id'].nunique()} configurations{each}) on "
                          + (f"{study.nodes} node(s) of {study.gpus} {gpu} GPUs{cluster_unused(study)}" if on_gpus
                             else "CPUs") + ": a prediction, not a measurement."))
    said.append(("prose", f"Assumed: micro-batches of {t.micro_batch_size} sequences of {m.n_positions} tokens per "
                          f"rank, a global batch of {t.global_batch_size} sequences (the rest by gradient "
                          f"accumulation), {t.max_steps} steps"
                          + (f"; {compute_words(gpu, mfu, calibration)}." if on_gpus else ".") + "\n"))
    by_size = "size" in table  # a study of model sizes, or --sizes: a table per size
    if not by_size:
        said.append(("table", plan_text(table, memory_gb if on_gpus else [])))
    for model_size, part in table.groupby("size", sort=False) if by_size else []:
        said.append(("table", f"\nGPT-2 {model_size}, {part['parameters'].iloc[0] / 1e6:,.0f}M parameters:"))
        ran = part[part["cannot_run"] == ""]
        if len(ran):
            said.append(("table", plan_text(ran, memory_gb if on_gpus else [])))
        for line in fit_lines(part, memory_gb if on_gpus else []):
            said.append(("prose", line))
    said.append(("prose", "\nMemory per rank: the model state (parameters, gradients, AdamW's state) on the rank "
                          "that holds the most, counted as every collected run checks it on rank 0; activations of "
                          "one forward pass with the logits, and communication buffers, estimated (within 2% of one "
                          "H200's eager one-GPU runs, in sample; not yet held to several GPUs)"
                          + (f". Spare is what is left of {USABLE_SHARE:.0%} of the GPU's memory, in GiB (the CUDA "
                             "context and the allocator take the rest)." if on_gpus else ".")))
    if on_gpus:
        said.append(("prose", f"Step time: {compute_words(gpu, mfu)}, a pipeline's bubble, and each group's "
                              f"collectives over {links.words(study.nodes)}, less what the strategy sends under its "
                              f"computation; {summary_words(published_summary(mfu), mfu)}."))
        if duration is not None:
            said.append(("prose", duration_words(study, duration, budget_s)))
    else:
        said.append(("prose", "Step time on CPUs: `gpt2dist estimate` times this machine."))
    for line in fit_lines(table, memory_gb) if on_gpus and not by_size else []:
        said.append(("prose", line))
    return said


def cluster_unused(study: Study) -> str:
    """What of the cluster the study's runs leave idle, said beside it: the runs are the preset's, not the cluster's."""
    nodes = max(run.nodes for run in study.runs)
    per_node = max(-(-run.nproc // run.nodes) for run in study.runs)
    unused = ([f"{nodes} node(s)"] if nodes < study.nodes else []) + (
        [f"{per_node} GPU(s) per node"] if per_node < study.gpus else [])
    return (f" (its runs use at most {' and '.join(unused)}: preset {study.preset_name}'s study.runs name no larger "
            "run; add one, with a global batch of at least micro-batch x GPUs, to use the rest)" if unused else "")


def tune_command(name: str, size: str | None, *, gpu: str, gpus: int, nodes: int, precision: str, memory_gb: float,
                 links: Links, params: Path) -> str:
    """The `gpt2dist tune` that measures, on the cluster a recommendation describes, the candidates it cannot tell
    apart: its options where they differ from tune's defaults (the parameter file the preset came from, unless it is
    the one the tune reads here by default), a SLURM profile past one node."""
    try:
        usual: Links | None = links_of(gpu)
    except UsageError:  # a GPU without a usual node: its links were all given
        usual = None
    words = ["gpt2dist tune", f"--gpus {gpus}"]
    if params.resolve() != Path(PARAMS_FILE).resolve():
        words.append(f"--params {shlex.quote(str(params))}")
    if nodes > 1:
        words += [f"--nodes {nodes}", f"--profile {SLURM_PROFILE}"]
    words += [f"--gpu {shlex.quote(gpu)}", f"--preset {name}", *([f"--size {size}"] if size else []),
              f"--precision {precision}"]
    for option, value in (("--link-inside", links.inside), ("--link-across", links.across), ("--nics", links.nics)):
        if usual is None or value != getattr(usual, option.removeprefix("--").removeprefix("link-")):
            words.append(f"{option} {value}")
    if memory_gb != max(gpu_memory_gb(gpu) or (memory_gb,)):
        words.append(f"--memory-gb {memory_gb:g}")
    return " ".join(words)


def recommend_report(name: str, chosen: Preset, stored: list, sizes: list[str | None], *, gpu: str, gpus: int,
                     nodes: int, precision: str, mfu: float | None, tokens: float, memory_gb: float,
                     links: Links, params: Path, calibration: dict | None = None,
                     tuned: TunedCalibration | None = None) -> list[Part]:
    """What `gpt2dist recommend` prints: the cluster and assumptions, per model size a table of the strategies by
    predicted hours with their verdict (each split corrected by a tune's measurement where `tuned`), then the
    step-time model's error on the stored studies and what it extrapolates beyond."""
    said: list[Part] = [("prose", f"Recommendation (a prediction, not a measurement) for {nodes} node(s) of {gpus} "
                                  f"{gpu} ({memory_gb:g} GB) linked by {links.words(nodes)}, preset {name}'s model"
                                  + (f" at {len(sizes)} sizes" if sizes != [None] else "") + f" in {precision}, "
                                  f"{tokens:,.0f} tokens, a global batch of the preset's micro-batch "
                                  f"({chosen.train.micro_batch_size}) per GPU: "
                                  f"{chosen.train.micro_batch_size * gpus * nodes} sequences, each split at every "
                                  "micro-batch that divides its replicas' share, the rest accumulated, "
                                  f"{compute_words(gpu, mfu, calibration)}:")]
    for size in sizes:
        table, errors = recommend(name, chosen, stored, gpu=gpu, gpus_per_node=gpus, nodes=nodes, precision=precision,
                                  mfu=mfu, tokens=tokens, memory_gb=memory_gb, links=links, size=size,
                                  calibration=calibration)
        if size:
            said.append(("prose", f"\nGPT-2 {size}, {parameter_count(model_of(chosen, size)) / 1e6:,.0f}M parameters:"))
        if tuned is not None:
            table = tuned.applied(table).sort_values(["note", "fits", "hours"], ascending=[True, False, True])
            asked = Cluster("cuda", gpus * nodes, nodes, gpu=gpu, gpus_per_node=gpus, links=links, memory_gb=memory_gb)
            said.append(("prose", tuned.words(asked, size)))
        runnable, refused = table[table["note"] == ""], table[table["note"] != ""]
        fitting = runnable[runnable["fits"]]
        said.append(("prose", f"{len(runnable)} candidates of {gpus * nodes} GPUs (every split dp x tp x pp with each "
                              "data-parallel method at each micro-batch, as it is and with activation checkpointing): "
                              f"{len(fitting)} fit, {len(runnable) - len(fitting)} do not, and "
                              f"{len(refused)} cannot run. The {min(TOP, len(runnable))} fastest predicted, what fits "
                              "first, with the step's terms (ms: computation, the pipeline's bubble, and the "
                              "communication each group leaves exposed):"))
        shown = runnable.head(TOP).assign(recompute=lambda t: t["recompute"].map({True: "yes", False: ""}))
        shown = shown[["strategy", "micro_batch", "accumulation", "recompute", "fits", "peak_gib", "step_ms",
                       "compute_ms", "bubble_ms", "dp_ms", "tp_ms", "pp_ms", "hours", "hours_low", "hours_high",
                       *(["tuned"] if tuned else [])]].astype({"micro_batch": int, "accumulation": int})
        said.append(("table", "\n" + tabulate(shown, headers="keys", tablefmt="github", showindex=False,
                                              floatfmt=",.2f")))
        said += [("prose", f"{row.strategy}: {row.note}") for row in refused.itertuples()
                 if row.strategy in STRATEGIES]  # the named ones; the others are the grammar's every split
        measure = "" if tuned else tune_command(name, size, gpu=gpu, gpus=gpus, nodes=nodes, precision=precision,
                                                   memory_gb=memory_gb, links=links, params=params)
        said.append(("prose", "\n" + verdict_line(fitting, published_summary(mfu)["search_ratio_high_abs_error"],
                                                   measure)))

    summary = published_summary(mfu)
    said.append(("prose", f"The hours' intervals span the {LOW:.0%} to {HIGH:.0%} percentiles of the error on GPU runs "
                          f"others published: {summary_words(summary, mfu)}."))
    if len(errors):
        e = errors["error"].dropna()
        said.append(("prose", f"Each strategy corrected by the stored GPU studies' runs "
                              f"({', '.join(s.name for s in stored if s.device == 'cuda')}), the correction learned "
                              f"from its other configurations (left out one at a time) leaves their {len(e)} "
                              f"configurations off by {e.abs().median():.0%} (median)."))
    said += [("prose", f"Extrapolating: {note}.") for note in extrapolations(stored, gpus * nodes, nodes)]
    return said


def tuned_cpu_report(tuned: TunedCalibration, name: str, chosen: Preset, sizes: list[str | None]) -> list[Part]:
    """What `gpt2dist recommend --calibration` prints for a tune on CPUs: the machine it ran on, every split by the CPU
    step model from the single step the tune timed there (scaled by FLOPs at another size), beside it the split
    corrected by the tune's measurement, fastest corrected first."""
    basis = tuned.basis
    said: list[Part] = [("prose", f"Recommendation (a prediction, not a measurement) for the machine a tune ran on, "
                                  f"{tuned.cluster.words()}: preset {name}'s model in {tuned.precision}, every split "
                                  f"by the CPU step model from single's step the tune timed there "
                                  f"({basis.single_step_s * 1e3:,.1f} ms at {tuned.size or 'the preset model'}), "
                                  f"its processes' collectives at {basis.busbw_gb_s:.2g} GB/s, calibrated by what "
                                  "the tune measured:")]
    timed = flops_per_token(model_of(chosen, tuned.size))
    for size in sizes:
        scaled = replace(basis, single_step_s=basis.single_step_s * flops_per_token(model_of(chosen, size)) / timed)
        table = predicted(name, chosen, tuned.cluster, tuned.precision, size, scaled)
        table = table[(table["cannot_run"] == "") & (table["computes_as"] == "")]
        if table.empty:
            raise UsageError(f"no split of {tuned.cluster.words()} can run preset {name}'s model"
                             + (f" at {size}" if size else ""))
        corrected = tuned.applied(table).assign(predicted_ms=table["step_s"] * 1e3).sort_values("step_s")
        measured = {name_: seconds * 1e3 for name_, seconds in tuned.measured_s.items()} if size == tuned.size else {}
        shown = pd.DataFrame({"split": corrected["strategy"], "predicted ms": corrected["predicted_ms"],
                              "calibrated ms": corrected["step_s"] * 1e3,
                              "measured by the tune ms": [measured.get(split) for split in corrected["strategy"]],
                              "correction": corrected["tuned"]})
        said.append(("prose", f"\n{size_words(size) if size else 'The preset model'}, {len(shown)} splits:"))
        said.append(("table", tabulate(shown, headers="keys", tablefmt="github", showindex=False, floatfmt=",.1f",
                                       missingval="")))
        best = corrected.iloc[0]
        said.append(("prose", f"Fastest calibrated: {best['strategy']}, {best['step_s'] * 1e3:,.1f} ms a step "
                              f"({best['tuned']}); the tune's measured tiers are in its summary.md."))
    said.append(("prose", tuned.words(tuned.cluster, sizes[-1])))
    return said


def projection_report(name: str, chosen: Preset, sizes: list[str | None], counts: list[int], *, gpu: str,
                      precision: str, mfu: float | None, gpus_per_node: int, links: Links,
                      strategies: tuple[str, ...] | None = None, calibration: dict | None = None) -> list[Part]:
    """What `gpt2dist project-scaling` prints: its assumptions, the projected table, and why a strategy has none."""
    table = projection(name, chosen, gpu=gpu, precision=precision, mfu=mfu, gpus_per_node=gpus_per_node,
                       node_counts=counts, links=links, sizes=sizes, calibration=calibration,
                       **({"strategies": strategies} if strategies else {}))
    projected = table["note"] == "projection"
    columns = ["size"] * (sizes != [None]) + ["strategy", "nodes", "gpus", "compute_ms", "bubble_ms",
                                             "communication_ms", "step_ms", "tokens_per_s", "scaling_efficiency"]
    said: list[Part] = [
        ("prose", f"Projection (not a measurement) of preset {name}: {gpu} {precision}, {compute_words(gpu, mfu, calibration)}, "
                  f"{gpus_per_node} GPUs per node, {links.words(max(counts))}, weak scaling: each GPU at the preset's "
                  f"micro-batch of {chosen.train.micro_batch_size}, the global batch growing with the GPUs; "
                  "communication a strategy overlaps with its computation counts only where the computation cannot "
                  "cover it.\n"),
        ("table", tabulate(table.loc[projected, columns], headers="keys", tablefmt="github", showindex=False,
                           floatfmt=",.2f"))]
    said += [("prose", f"\n{row.strategy}{f' ({row.size})' if row.size else ''}: {row.note}")
             for row in table.loc[~projected].drop_duplicates(["size", "strategy"]).itertuples(index=False)]
    return said


def validation_report(predicted: pd.DataFrame, ordered: pd.DataFrame, searched: pd.DataFrame, summary: dict,
                      mfu: float | None, table: Path | None, added: list[Path]) -> list[Part]:
    """What `gpt2dist validate-published` prints: per group (one source's machine) its rows' error, the pairs it
    orders as published and its searches' picks; the pairs and picks it gets wrong, by name; the rows left out, the
    constants and the summary. Each row beside its prediction: --format csv or json."""
    rows = predicted[predicted["left_out"] == ""]
    by_group = rows.groupby("group", sort=False)
    pairs_of = ordered.groupby("group", sort=False)
    searches_of = searched.groupby("group", sort=False)

    def of(counted, group: str, column: str) -> str:
        if group not in counted.groups:
            return ""
        part = counted.get_group(group)
        return f"{int(part[column].sum())}/{len(part)}"

    said: list[Part] = [
        ("prose", "Published GPU measurements of GPT-2-family training against the planner ("
                  + ("the GPU step model, each source's rows predicted with the constants fitted to every other "
                     "source's" if mfu is None else f"compute at an assumed MFU of {mfu:.0%}")
                  + "; each row's links and program as its source describes them). Per group (one source's machine): "
                    "its rows' throughput error, the pairs of rows it orders as published, and its searches (rows of "
                    "one model, GPU count, batch and program that differ in the split or micro-batch): the pick is "
                    f"the fastest measured (within {SEARCH_TIE:.0%}) or within {WITHIN:.0%} of it, and the worst "
                    "pick's measured step over the fastest's:\n"),
        ("table", tabulate(
            [{"group": group, "GPU": part["gpu"].iloc[0], "program": part["implementation"].iloc[0], "rows": len(part),
              "median |error|": f"{part['throughput_error'].abs().median():.0%}",
              "median error": f"{part['throughput_error'].median():+.0%}", "pairs ordered": of(pairs_of, group, "ordered"),
              "searches: fastest": of(searches_of, group, "top1"), f"within {WITHIN:.0%}": of(searches_of, group, "within"),
              "worst regret": (f"{searches_of.get_group(group)['regret'].max():.2f}" if group in searches_of.groups
                               else "")}
             for group, part in by_group],
            headers="keys", tablefmt="github", disable_numparse=True)),
        ("table", "")]
    for group, part in pairs_of:
        wrong = part[~part["ordered"]].sort_values("ratio_error", key=abs, ascending=False)
        if not wrong.empty:
            named = ", ".join(f"{r.first} / {r.second} published {r.published_ratio:.2f}, predicted "
                              f"{r.predicted_ratio:.2f}" for r in wrong.head(SHOWN).itertuples())
            more = f", and {len(wrong) - SHOWN} more" if len(wrong) > SHOWN else ""
            said.append(("prose", f"{group}: {int(part['ordered'].sum())} of {len(part)} pairs ordered as published, "
                                  f"their ratio off by {part['ratio_error'].abs().median():.0%} (median); not: "
                                  f"{named}{more}"))
    missed = searched[~searched["within"]].sort_values("regret", ascending=False)
    if not missed.empty:
        said.append(("prose", f"\nThe {len(missed)} search(es) whose pick is more than {WITHIN:.0%} from the fastest"
                              + (f", the {SHOWN} worst" if len(missed) > SHOWN else "") + ":"))
        said += [("prose", f"- {m.group}, {m.gpus} GPU(s), {m.n_layer} x {m.n_embd}, global batch {m.global_batch}: "
                           f"picked {m.pick_strategy} at micro-batch {m.pick_micro_batch} ({m.pick}), measured "
                           f"{m.regret:.2f}x the fastest, {m.fastest_strategy} at {m.fastest_micro_batch} ({m.fastest})")
                 for m in missed.head(SHOWN).itertuples()]
    said += [("prose", f"{row.row} ({row.group}) left out: {row.left_out}")
             for row in predicted[predicted["left_out"] != ""].itertuples()]
    if "constants" in summary:
        held = summary.get("held", {})
        said.append(("prose", "\nThe constants fitted to every row (plan and recommend use those of the shipped "
                              "table, all fitted): " + ", ".join(
                                  f"{name} {value:.3g}" + (" (held)" if name in held else "")
                                  for name, value in summary["constants"].items()) + "."))
    said.append(("prose", f"\nIn all: {summary_words(summary, mfu)}. Pairs whose published throughputs are within "
                          f"{TIE:.0%} of each other are ties, not counted. The table, with each row's source and what "
                          f"is unclear about it: {table or 'src/gpt2dist/forecast/published_gpt2.csv'}"
                          + "".join(f", with the rows of {path}" for path in added)
                          + "; each row beside its prediction: --format csv."))
    return said
