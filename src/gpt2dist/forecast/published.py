"""The GPU step model held to GPT-2-family training that others measured on GPUs and published (published_gpt2.csv:
each row's source, its setup as the planner's input, the program that trained (forecast.implementations), its result
as published and as seconds per optimizer step).

The model's constants (forecast.gpu_step.Constants) are fitted to the table, and judged only out of source: each
source's rows are predicted with the constants fitted to every other source's, so no source ever tunes its own
prediction. What the planner quotes is that error: of each row's throughput, and within a group (one source, one
machine) of the ratio of two rows' throughputs, which its rankings rest on; a pair is ordered right when the
prediction puts the same row ahead. The constants plan and recommend use are those fitted to every row
(gpu_fit.json, written from the table by `gpt2dist validate-published --write-fit`).

Rows whose strategy is outside the registry stay in the table, left out of every error. A row is predicted where its
split fits its model and cluster (config.strategies.check_placement), whatever this engine's runtime refuses of it:
fp16 under tensor parallelism or a pipeline, which Megatron's own loss scaler runs, is the same arithmetic."""

from __future__ import annotations

import functools
import json
import math
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pandas as pd
from pydantic import ValidationError

from gpt2dist.config.memory import GIB, predict
from gpt2dist.config.schema import ModelConfig, RunSpec, TrainConfig
from gpt2dist.config.split import parse_split
from gpt2dist.config.strategies import check_placement
from gpt2dist.errors import UsageError
from gpt2dist.forecast.gpu_step import Constants, Implementation, StepWork, StepWorks, mfu_step_terms, step_work
from gpt2dist.forecast.implementations import ENGINE_NAME, PUBLISHED, engine_implementation
from gpt2dist.io import atomic_write_json, cannot_be_read
from gpt2dist.system.hardware import COMPUTE_DTYPE, GPUS, gpu_of
from gpt2dist.system.links import ACROSS_NODES, INSIDE_NODE, Links

TABLE = Path(__file__).with_name("published_gpt2.csv")
FIT = Path(__file__).with_name("gpu_fit.json")
# What a prediction reads of a row
COLUMNS = ["row", "source", "group", "gpu", "gpus", "gpus_per_node", "nodes", "link_inside", "link_across", "nics",
           "n_layer", "n_head", "n_embd", "seq_len", "vocab", "strategy", "outside", "precision", "micro_batch",
           "global_batch", "checkpointing", "implementation", "step_s", "memory_gib", "memory_measure"]
# What a row's memory measured: torch's peak allocated (what the planner predicts), or the device's use as nvidia-smi
# shows it (the CUDA context and the allocator's cache beside the peak: the prediction belongs below it)
ALLOCATED, DEVICE = "allocated", "device"
# Two rows whose published throughputs are closer than this are a tie, not an ordering to get right
TIE = 0.03
# Where a fit may take each constant: the physical range, so that a constant cannot stand in for another's work.
# A program's GEMMs reach at most the best matmul measured on the GPU (system.hardware); a kernel costs its GPU 1-8
# microseconds beyond its work (launch latency and tail), a Python-dispatched operator its host 5-100. The memory
# bandwidth a kernel sustains and the bus bandwidth NCCL reaches are measured, not fitted (system.hardware,
# system.links): fitted, they stood in for work the model leaves out, and the picks of the published searches
# followed them (docs/planning.md).
BOUNDS = {"gemm_efficiency": (0.2, 1.0), "flash_efficiency": (0.05, 1.0), "kernel_s": (1e-6, 8e-6),
          "host_op_s": (5e-6, 100e-6)}
START = Constants(0.8, 0.4, 4e-6, 15e-6)  # where each fit starts
# The fit weighs each row by 1 / sqrt(rows of its source): a source of thirty rows counts more than one of one,
# not thirty times as much; errors are of log(predicted / published) under a soft L1 loss, so that a row far off
# (a setup the table describes wrongly) pulls the constants less than a square would
LOSS_SCALE = 0.1
# Bookkeeping a TrainConfig needs and no prediction reads
_UNREAD = {"max_steps": 1, "lr": 1e-4, "min_lr": 0.0, "eval_interval": 1, "eval_batches": 1, "checkpoint_interval": 1}
LOW, HIGH = 0.05, 0.95  # the percentiles of the out-of-source errors a GPU prediction's interval spans


def read_table(path: Path = TABLE, option: str = "--table") -> pd.DataFrame:
    """The table, every cell checked (cells): a missing column is a table of another layout, a cell outside what its
    column allows is one error naming the row, the column and what is allowed (and the `option` that gave it)."""
    if not path.is_file():
        raise UsageError(f"{option} {path}: no such file")
    try:
        table = pd.read_csv(path, dtype=str, keep_default_na=False)
    except (UnicodeDecodeError, pd.errors.ParserError, pd.errors.EmptyDataError):
        raise UsageError(f"{option} {path}: not a CSV table; write it in the columns of {TABLE.name}") from None
    missing = [column for column in COLUMNS if column not in table]
    if missing:
        raise UsageError(f"{option} {path}: no column {', '.join(missing)}; write it in the columns of {TABLE.name}")
    if table.empty:
        raise UsageError(f"{option} {path}: no rows under its header; add a measurement in the columns of "
                         f"{TABLE.name}")
    return cells(table, f"{option} {path}")


def read_tables(path: Path, added: list[Path]) -> pd.DataFrame:
    """The table at `path` with the rows of each `added` one (a GPU tune's measured.csv among them), each checked as
    read_table does; a row named in two of them is refused, naming both."""
    combined = read_table(path).assign(_from=str(path))
    for extra in added:
        more = read_table(extra, "--add")
        twice = more["row"][more["row"].isin(combined["row"])]
        if len(twice):
            other = combined.loc[combined["row"] == twice.iloc[0], "_from"].iloc[0]
            raise UsageError(f"--add {extra}: row {twice.iloc[0]!r} is also in {other}; give each row its own name, "
                             "or add the file once")
        combined = pd.concat([combined, more.assign(_from=str(extra))], ignore_index=True)
    return combined.drop(columns="_from")


def setup_columns(model: ModelConfig, train: TrainConfig) -> dict:
    """A run's model and batch in the table's columns, as row_spec reads them back."""
    return {"n_layer": model.n_layer, "n_head": model.n_head, "n_embd": model.n_embd, "seq_len": model.n_positions,
            "vocab": model.vocab_size, "micro_batch": train.micro_batch_size, "global_batch": train.global_batch_size,
            "checkpointing": train.activation_checkpointing}


def table_header() -> list[str]:
    """The shipped table's columns in its order: what a table of new measurements is written in."""
    return list(pd.read_csv(TABLE, nrows=0).columns)


COUNTS = ("gpus", "gpus_per_node", "nodes", "nics", "n_layer", "n_head", "n_embd", "seq_len", "vocab", "micro_batch",
          "global_batch")  # whole numbers, 1 or more
NAMED = ("row", "source", "where", "group", "conversion")  # said for every row
CHOICES = {"link_inside": tuple(INSIDE_NODE), "link_across": tuple(ACROSS_NODES), "precision": tuple(COMPUTE_DTYPE),
           "checkpointing": ("none", "block"), "memory_measure": ("", ALLOCATED, DEVICE)}


def cells(table: pd.DataFrame, said: str) -> pd.DataFrame:
    """The table with its numbers read, or the first cell (by row, then by column in the table's order) its column
    does not allow, refused in one line that begins with `said` (the option and file that gave the table)."""
    faults: list[tuple[int, int, str]] = []  # (row's index, column's position, what is wrong)

    def check(column: str, bad: pd.Series, problem: str) -> None:
        if bad.any():
            faults.append((int(bad.to_numpy().argmax()), list(table.columns).index(column), problem))

    def number(column: str) -> pd.Series:
        return pd.to_numeric(table[column].str.strip().replace("", "nan"), errors="coerce")

    for column in NAMED:
        check(column, table[column].str.strip() == "", "is empty; say it for every row")
    counts = {column: number(column) for column in COUNTS}
    for column, values in counts.items():
        check(column, ~(np.isfinite(values) & (values >= 1) & (values == values.round())),
              "is not a whole number of 1 or more")
    for column, allowed in CHOICES.items():
        check(column, ~table[column].isin(allowed), f"is not one of {', '.join(repr(a) for a in allowed)}")
    check("gpu", table["gpu"].map(lambda name: gpu_of(name) is None),
          f"names no GPU with a datasheet here (known: {', '.join(GPUS)})")
    inside = table["outside"] == ""  # a row outside the registry says why instead of naming its strategy and program
    check("strategy", inside & table["strategy"].map(lambda name: _split_refusal(name) is not None),
          "is no strategy of the grammar (config/split.py: a named one, or a method with degrees such as ddp-tp2-pp2); "
          "or say in column outside why the registry has none for it")
    check("implementation", inside & ~table["implementation"].isin([ENGINE_NAME, *PUBLISHED]),
          f"is no program the step model counts (known: {ENGINE_NAME}, {', '.join(PUBLISHED)})")
    step_s, memory = number("step_s"), number("memory_gib")
    check("step_s", ~(np.isfinite(step_s) & (step_s > 0)), "is not a number of seconds above 0")
    given = table["memory_gib"].str.strip() != ""
    check("memory_gib", given & ~(np.isfinite(memory) & (memory > 0)),
          "is not a number of GiB above 0 (or empty where none was published)")
    check("memory_measure", given != (table["memory_measure"] != ""),
          f"does not go with column memory_gib: give both ({ALLOCATED} or {DEVICE}) or neither")
    check("row", table["row"].duplicated(), "names a row twice; give each row its own name")
    if faults:
        index, position, problem = min(faults)
        column = table.columns[position]
        raise UsageError(f"{said}: row {table.at[index, 'row'] or index + 1} (line {index + 2}), column "
                         f"{column}: {table.at[index, column]!r} {problem}")
    return table.assign(**{column: values.astype(int) for column, values in counts.items()}, step_s=step_s,
                        memory_gib=memory)


def _split_refusal(name: str) -> str | None:
    try:
        parse_split(name, said="strategy")
    except UsageError as exc:
        return str(exc)
    return None


def row_spec(row: pd.Series) -> RunSpec:
    """A published row as the planner's input."""
    model = ModelConfig(n_layer=int(row.n_layer), n_head=int(row.n_head), n_embd=int(row.n_embd),
                        n_positions=int(row.seq_len), vocab_size=int(row.vocab))
    train = TrainConfig(global_batch_size=int(row.global_batch), micro_batch_size=int(row.micro_batch),
                        activation_checkpointing=row.checkpointing, **_UNREAD)
    return RunSpec(data_dir="", out_dir="", preset=f"published-{row.row}", strategy=row.strategy,
                   precision=row.precision, nproc=int(row.gpus), nodes=int(row.nodes),
                   device="cuda", model=model, train=train)


def implementation_of(row: pd.Series, spec: RunSpec) -> Implementation:
    """The program that trained a row: this engine, or one of forecast.implementations'."""
    return engine_implementation(spec) if row.implementation == ENGINE_NAME else PUBLISHED[row.implementation]


def row_works(table: pd.DataFrame) -> list[StepWork | str]:
    """Each row's step as the GPU step model counts it, or why it is left out."""
    works: list[StepWork | str] = []
    for _, row in table.iterrows():
        if row.outside:
            works.append(f"outside the registry: {row.outside}")
            continue
        try:
            spec = row_spec(row)
            check_placement(spec, min(int(row.gpus), int(row.gpus_per_node)))
            works.append(step_work(spec, row.gpu, implementation_of(row, spec),
                                   Links(row.link_inside, row.link_across, int(row.nics))))
        except (UsageError, ValidationError) as refusal:
            works.append(f"refused by the planner: {' '.join(str(refusal).split())}")
    return works


def memory_of(row: pd.Series) -> int:
    """A row's peak bytes per GPU as config.memory predicts them for the program that trained it."""
    spec = row_spec(row)
    return predict(spec, kept=implementation_of(row, spec).kept).peak


def fit(works: list[StepWork], step_s: np.ndarray, sources: np.ndarray, held: dict[str, float] | None = None,
        start: Constants = START) -> Constants:
    """The constants that bring the works' predicted steps closest to the published ones (the module's doc), those
    `held` kept at their value."""
    counts = pd.Series(sources).map(pd.Series(sources).value_counts()).to_numpy()
    weights = 1 / np.sqrt(counts)
    bounds = BOUNDS | {name: (value, value * (1 + 1e-9)) for name, value in (held or {}).items()}
    low, high = (np.log([bounds[name][side] for name in Constants.NAMES]) for side in (0, 1))

    priced = StepWorks(works)

    def residuals(log_constants: np.ndarray) -> np.ndarray:
        return weights * np.log(priced.totals(Constants(*np.exp(log_constants))) / step_s)

    from scipy.optimize import least_squares  # here: plan and recommend read the shipped fit, and start 0.5 s sooner

    begin = np.clip(np.log([getattr(start, name) for name in Constants.NAMES]), low, high)
    solved = least_squares(residuals, begin, bounds=(low, high), loss="soft_l1", f_scale=LOSS_SCALE)
    return Constants(*(float(value) for value in np.exp(solved.x)))


def check_held(held: dict[str, float]) -> None:
    """Refuse a held constant the model has not, or a value outside its physical range, in one line."""
    for name, value in held.items():
        if name not in BOUNDS:
            raise UsageError(f"--hold {name}: the GPU step model's constants are {', '.join(Constants.NAMES)}")
        low, high = BOUNDS[name]
        if not low <= value <= high:
            raise UsageError(f"--hold {name}={value:g}: outside its physical range, {low:g} to {high:g}")


def predictions(table: pd.DataFrame, mfu: float | None = None,
                held: dict[str, float] | None = None) -> tuple[pd.DataFrame, dict]:
    """Each row with its predicted step time, throughput and peak memory per GPU beside the published ones, and their
    errors (predicted / published - 1): out of source (the constants fitted without the row's source, which
    `fitted_without` names), or, with `mfu`, at that assumed MFU (the model before this one); `held` constants are
    not fitted but kept at their value (what each changes out of source). Rows left out say why in `left_out`. Also
    the constants: fitted to every row ("all") and without each source (by source); none with `mfu`."""
    works = row_works(table)
    usable = [index for index, work in enumerate(works) if not isinstance(work, str)]
    sources = table["source"].to_numpy()
    step_s = table["step_s"].to_numpy(dtype=float)
    predicted = np.full(len(table), math.nan)
    fits: dict = {}
    if mfu is not None:
        for index in usable:
            row = table.iloc[index]
            links = Links(row.link_inside, row.link_across, int(row.nics))
            predicted[index] = mfu_step_terms(row_spec(row), row.gpu, mfu, links).total_s
    elif usable:
        fits["all"] = fit([works[i] for i in usable], step_s[usable], sources[usable], held)
        for source in dict.fromkeys(sources[usable]):
            others = [i for i in usable if sources[i] != source]
            if others:  # a source alone has no other to be fitted to
                fits[source] = fit([works[i] for i in others], step_s[others], sources[others], held)
                for i in usable:
                    if sources[i] == source:
                        predicted[i] = works[i].terms(fits[source]).total_s
    memory = [math.nan if isinstance(work, str) else memory_of(table.iloc[i]) / GIB for i, work in enumerate(works)]
    tokens = table["global_batch"].to_numpy(dtype=float) * table["seq_len"].to_numpy(dtype=float)
    out = table.reset_index(drop=True).assign(
        left_out=[work if isinstance(work, str) else "" for work in works],
        fitted_without=[source if source in fits and not isinstance(work, str) else ""
                        for source, work in zip(sources, works)],
        published_tokens_per_s=tokens / step_s, predicted_step_s=predicted, predicted_tokens_per_s=tokens / predicted,
        predicted_memory_gib=memory)
    return out.assign(throughput_error=lambda t: t["predicted_tokens_per_s"] / t["published_tokens_per_s"] - 1,
                      memory_error=lambda t: t["predicted_memory_gib"] / t["memory_gib"] - 1), fits


# What a search holds fixed: one source's machine, the model, the GPUs and the tokens per step, in one program and
# precision; its rows differ in the split, the data-parallel method, the micro-batch or activation checkpointing:
# what a user choosing a configuration for their GPUs chooses between
SEARCH_KEYS = ["group", "gpus", "nodes", "n_layer", "n_head", "n_embd", "seq_len", "global_batch", "precision",
               "implementation"]
SEARCH_TIE = 0.02  # a pick measured within this of the best is the best: runs of one setup vary by as much
WITHIN = 0.05


def pairs(predicted: pd.DataFrame) -> pd.DataFrame:
    """Every two predicted rows of one group whose published throughputs differ by more than TIE: the published
    ratio (first over second), the predicted one, whether the prediction orders them as published, its ratio's error
    (predicted / published ratio - 1), whether both ran on as many GPUs (then only the strategy, the precision,
    the micro-batch or the link differs: the harder pairs, where more GPUs alone do not tell the order), and whether
    both are of one search (what a user picking a configuration for their GPUs weighs; rows without SEARCH_KEYS'
    columns, as the stored CPU studies' in forecast.shortlist, are of none)."""
    frames = []
    usable = predicted[predicted["predicted_tokens_per_s"].notna() & predicted["published_tokens_per_s"].notna()]
    for group, members in usable.groupby("group", sort=False):
        first, second = np.triu_indices(len(members), k=1)  # a group of 1,440 rows has a million pairs
        published = members["published_tokens_per_s"].to_numpy()
        modelled = members["predicted_tokens_per_s"].to_numpy()
        gpus, rows = members["gpus"].to_numpy(), members["row"].to_numpy()
        search = (members.groupby(SEARCH_KEYS, sort=False).ngroup().to_numpy() if set(SEARCH_KEYS) <= set(members)
                  else np.arange(len(members)))
        ratio, guess = published[first] / published[second], modelled[first] / modelled[second]
        kept = np.abs(ratio - 1) > TIE
        first, second, ratio, guess = first[kept], second[kept], ratio[kept], guess[kept]
        frames.append(pd.DataFrame({"group": group, "first": rows[first], "second": rows[second],
                                    "published_ratio": ratio, "predicted_ratio": guess,
                                    "ordered": (ratio > 1) == (guess > 1), "ratio_error": guess / ratio - 1,
                                    "same_gpus": gpus[first] == gpus[second],
                                    "same_search": search[first] == search[second]}))
    columns = ["group", "first", "second", "published_ratio", "predicted_ratio", "ordered", "ratio_error", "same_gpus",
               "same_search"]
    return pd.concat(frames, ignore_index=True)[columns] if frames else pd.DataFrame(columns=columns)


def searches(predicted: pd.DataFrame) -> pd.DataFrame:
    """Each search (SEARCH_KEYS; two predicted rows at least): its rows, the measured fastest, the predicted fastest
    (the pick), whether the pick is the fastest (measured within SEARCH_TIE of it) or within WITHIN of it, and its
    regret (the pick's measured step over the fastest's)."""
    usable = predicted[predicted["predicted_step_s"].notna()]
    found = []
    for keys, members in usable.groupby(SEARCH_KEYS, sort=False):
        if len(members) < 2:
            continue
        best, pick = members.loc[members["step_s"].idxmin()], members.loc[members["predicted_step_s"].idxmin()]
        regret = pick["step_s"] / best["step_s"]
        found.append({**dict(zip(SEARCH_KEYS, keys)), "rows": len(members), "fastest": best["row"],
                      "fastest_strategy": best["strategy"], "fastest_micro_batch": best["micro_batch"],
                      "pick": pick["row"], "pick_strategy": pick["strategy"], "pick_micro_batch": pick["micro_batch"],
                      "regret": regret, "top1": regret <= 1 + SEARCH_TIE, "within": regret <= 1 + WITHIN})
    columns = [*SEARCH_KEYS, "rows", "fastest", "fastest_strategy", "fastest_micro_batch", "pick", "pick_strategy",
               "pick_micro_batch", "regret", "top1", "within"]
    return pd.DataFrame(found, columns=columns)


def error_summary(predicted: pd.DataFrame, ordered: pd.DataFrame, searched: pd.DataFrame) -> dict[str, float | int]:
    """The numbers the planner quotes: rows and sources predicted, pairs ordered as published, the searches whose
    pick is the fastest or near it and the regret, the throughput's median, worst and 5th to 95th percentile error,
    the ratio's median |error| within groups, the memory's where the peak allocated was published, and how many of
    the devices' published use the prediction stays below."""
    throughput = predicted["throughput_error"].dropna()
    memory = predicted.loc[predicted["memory_measure"] == ALLOCATED, "memory_error"].dropna()
    device = predicted.loc[predicted["memory_measure"] == DEVICE, "memory_error"].dropna()

    def worst(errors: pd.Series) -> float:
        return float(errors.loc[errors.abs().idxmax()]) if len(errors) else math.nan

    def median(errors: pd.Series) -> float:
        return float(errors.abs().median()) if len(errors) else math.nan

    predicted_rows = predicted["predicted_tokens_per_s"].notna()
    return {"rows": len(predicted), "predicted_rows": int(predicted_rows.sum()),
            "groups": int(predicted.loc[predicted_rows, "group"].nunique()),
            "sources": int(predicted.loc[predicted_rows, "source"].nunique()),
            "pairs": len(ordered), "pairs_ordered": int(ordered["ordered"].sum()),
            "same_gpus_pairs": int(ordered["same_gpus"].sum()),
            "same_gpus_pairs_ordered": int((ordered["same_gpus"] & ordered["ordered"]).sum()),
            "searches": len(searched), "searches_top1": int(searched["top1"].sum()),
            "searches_within": int(searched["within"].sum()),
            "regret_median": float(searched["regret"].median()) if len(searched) else math.nan,
            "regret_worst": float(searched["regret"].max()) if len(searched) else math.nan,
            "ratio_median_abs_error": median(ordered["ratio_error"]),
            "ratio_high_abs_error": float(ordered["ratio_error"].abs().quantile(HIGH)) if len(ordered) else math.nan,
            "search_ratio_high_abs_error": float(ordered.loc[ordered["same_search"], "ratio_error"].abs().quantile(HIGH))
            if ordered["same_search"].any() else math.nan,
            "throughput_median_abs_error": median(throughput), "throughput_worst_error": worst(throughput),
            "throughput_low_error": float(throughput.quantile(LOW)) if len(throughput) else math.nan,
            "throughput_high_error": float(throughput.quantile(HIGH)) if len(throughput) else math.nan,
            "memory_rows": len(memory), "memory_median_abs_error": median(memory), "memory_worst_error": worst(memory),
            "device_rows": len(device), "device_rows_below": int((device < 0).sum())}


def validation(table: pd.DataFrame, mfu: float | None = None,
               held: dict[str, float] | None = None) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, dict]:
    """A table's predictions (out of source, or at `mfu`; `held` constants kept at their value), its pairs, its
    searches, and error_summary with (without `mfu`) the constants fitted to every row and to every source but
    each."""
    predicted, fits = predictions(table, mfu, held)
    ordered, searched = pairs(predicted), searches(predicted)
    summary = error_summary(predicted, ordered, searched)
    if fits:
        summary |= {"constants": asdict(fits.pop("all")),
                    "without_source": {source: asdict(constants) for source, constants in fits.items()}}
    if held:
        summary["held"] = held
    return predicted, ordered, searched, summary


def write_fit(path: Path, summary: dict) -> None:
    """What plan and recommend read: validation's summary of a table, with the constants fitted to every row."""
    atomic_write_json(path, summary)


@functools.cache
def shipped_fit() -> dict:
    """gpu_fit.json: the constants fitted to the shipped table and its out-of-source error."""
    try:
        return json.loads(FIT.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise UsageError(cannot_be_read(FIT, str(exc), "reinstall gpt2dist, or write it again with `gpt2dist "
                                                       "validate-published --write-fit`")) from None


def shipped_constants() -> Constants:
    return Constants(**shipped_fit()["constants"])


@functools.cache
def published_summary(mfu: float | None = None) -> dict:
    """The shipped table's error summary: the GPU step model's out of source (gpu_fit.json), or at `mfu`; once a
    process (recommend asks it per model size)."""
    return shipped_fit() if mfu is None else validation(read_table(), mfu)[3]


def summary_words(summary: dict, mfu: float | None = None) -> str:
    """One sentence a GPU prediction is quoted with: the error of the GPU step model out of source, or at `mfu`."""
    share = f" ({summary['pairs_ordered'] / summary['pairs']:.0%})" if summary["pairs"] else ""
    memory = (f"; its memory by {summary['memory_median_abs_error']:.0%} (median) to "
              f"{summary['memory_worst_error']:+.0%} where {summary['memory_rows']} row(s) give the peak allocated"
              if summary["memory_rows"] else "")
    if summary["device_rows"]:
        memory += (f", and below the device's use (nvidia-smi) in {summary['device_rows_below']} of "
                   f"{summary['device_rows']} rows that give that")
    held, model = (("held out of source", "the GPU step model's throughput") if mfu is None else
                   ("held", f"the throughput at an assumed MFU of {mfu:.0%}"))
    return (f"{held} to {summary['predicted_rows']} published GPU measurements from {summary['sources']} "
            f"sources in {summary['groups']} group(s) (gpt2dist validate-published), {model} is off by "
            f"{summary['throughput_median_abs_error']:.0%} (median; {summary['throughput_low_error']:+.0%} to "
            f"{summary['throughput_high_error']:+.0%}, 5th to 95th percentile; worst "
            f"{summary['throughput_worst_error']:+.0%}); it orders {summary['pairs_ordered']:,} of "
            f"{summary['pairs']:,} same-machine pairs as published{share}, {summary['same_gpus_pairs_ordered']:,} of "
            f"{summary['same_gpus_pairs']:,} of those on as many GPUs, their ratio off by "
            f"{summary['ratio_median_abs_error']:.0%} (median); {search_words(summary)}" + memory)


def search_words(summary: dict) -> str:
    """How the planner's picks fared on the published searches."""
    if not summary["searches"]:
        return "no search of configurations to pick from"
    return (f"its pick is the fastest measured in {summary['searches_top1']} of {summary['searches']} searches "
            f"(within {SEARCH_TIE:.0%}) and within {WITHIN:.0%} of it in {summary['searches_within']}, the pick's "
            f"measured step {summary['regret_median']:.2f}x the fastest's (median), {summary['regret_worst']:.2f}x at "
            "worst")
