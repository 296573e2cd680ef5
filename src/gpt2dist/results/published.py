"""The planner held to GPT-2-family training that others measured on GPUs and published (published_gpt2.csv: each
row's source, its setup as the planner's input, its result as published and as seconds per optimizer step).

Sources differ in framework and software age, so a row's absolute error mostly says how far its framework is
from the assumed MFU; within a group (one source, one machine) that cancels, and the ratio of two rows'
throughputs is what the planner's ranking rests on: a pair is ordered right when the planner puts the same row
ahead. Rows whose strategy is outside the registry stay in the table, left out of every error. A row is
predicted where its split fits its model and cluster (config.strategies.check_placement), whatever this engine's
runtime refuses of it: fp16 under tensor parallelism or a pipeline, which Megatron's own loss scaler runs, is the same
arithmetic."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import pandas as pd
from pydantic import ValidationError

from gpt2dist.config.memory import GIB, predict
from gpt2dist.config.schema import ModelConfig, RunSpec, TrainConfig
from gpt2dist.config.strategies import check_placement
from gpt2dist.errors import UsageError
from gpt2dist.results.plan import gpu_step_seconds
from gpt2dist.system.links import Links

TABLE = Path(__file__).with_name("published_gpt2.csv")
# What a prediction reads of a row
COLUMNS = ["row", "group", "gpu", "gpus", "gpus_per_node", "nodes", "link_inside", "link_across", "nics", "n_layer",
           "n_head", "n_embd", "seq_len", "vocab", "strategy", "outside", "precision", "micro_batch", "global_batch",
           "checkpointing", "step_s", "memory_gib", "memory_measure"]
# What a row's memory measured: torch's peak allocated (what the planner predicts), or the device's use as nvidia-smi
# shows it (the CUDA context and the allocator's cache beside the peak: the prediction belongs below it)
ALLOCATED, DEVICE = "allocated", "device"
# Two rows whose published throughputs are closer than this are a tie, not an ordering to get right
TIE = 0.03
# Bookkeeping a TrainConfig needs and no prediction reads
_UNREAD = {"max_steps": 1, "lr": 1e-4, "min_lr": 0.0, "eval_interval": 1, "eval_batches": 1, "checkpoint_interval": 1}


def read_table(path: Path = TABLE) -> pd.DataFrame:
    """The table, its columns checked: a missing one is a table of another layout."""
    if not path.is_file():
        raise UsageError(f"--table {path}: no such file")
    try:
        table = pd.read_csv(path, dtype={"strategy": str, "outside": str}, keep_default_na=False,
                           na_values={"memory_gib": [""], "step_s": [""]})
    except (UnicodeDecodeError, pd.errors.ParserError, pd.errors.EmptyDataError):
        raise UsageError(f"--table {path}: not a CSV table; write it in the columns of {TABLE.name}") from None
    missing = [column for column in COLUMNS if column not in table]
    if missing:
        raise UsageError(f"--table {path}: no column {', '.join(missing)}; write it in the columns of {TABLE.name}")
    return table


def row_spec(row: pd.Series) -> RunSpec:
    """A published row as the planner's input."""
    model = ModelConfig(n_layer=int(row.n_layer), n_head=int(row.n_head), n_embd=int(row.n_embd),
                        n_positions=int(row.seq_len), vocab_size=int(row.vocab))
    train = TrainConfig(global_batch_size=int(row.global_batch), micro_batch_size=int(row.micro_batch),
                        activation_checkpointing=row.checkpointing, **_UNREAD)
    return RunSpec(data_dir="", out_dir="", preset=f"published-{row.row}", strategy=row.strategy,
                   precision=row.precision, nproc=int(row.gpus), nodes=int(row.nodes),
                   device="cuda", model=model, train=train)


def predictions(table: pd.DataFrame, mfu: float) -> pd.DataFrame:
    """Each row with the planner's step time, throughput and peak memory per GPU beside the published ones, and
    their errors (predicted / published - 1); rows outside the registry or refused by it say why in `left_out`."""
    if not 0 < mfu <= 1:
        raise UsageError(f"--mfu is a fraction of the peak in (0, 1], got {mfu:g}")
    rows = []
    for _, row in table.iterrows():
        out = {"left_out": row.outside and f"outside the registry: {row.outside}"}
        tokens = int(row.global_batch) * int(row.seq_len)
        out["published_tokens_per_s"] = tokens / row.step_s if row.step_s else math.nan
        if not row.outside:
            try:
                spec = row_spec(row)
                check_placement(spec, min(int(row.gpus), int(row.gpus_per_node)))
                links = Links(row.link_inside, row.link_across, int(row.nics))
                step = gpu_step_seconds(spec, row.gpu, mfu, links)
            except (UsageError, ValidationError) as refusal:
                out["left_out"] = f"refused by the planner: {' '.join(str(refusal).split())}"
            else:
                out |= {"predicted_step_s": step, "predicted_tokens_per_s": tokens / step,
                        "predicted_memory_gib": predict(spec).peak / GIB}
        rows.append(out)
    predicted = pd.concat([table.reset_index(drop=True), pd.DataFrame(rows)], axis=1)
    for column in ("predicted_step_s", "predicted_tokens_per_s", "predicted_memory_gib"):
        if column not in predicted:
            predicted[column] = math.nan
    return predicted.assign(
        throughput_error=lambda t: t["predicted_tokens_per_s"] / t["published_tokens_per_s"] - 1,
        memory_error=lambda t: t["predicted_memory_gib"] / t["memory_gib"] - 1)


def pairs(predicted: pd.DataFrame) -> pd.DataFrame:
    """Every two predicted rows of one group whose published throughputs differ by more than TIE: the published
    ratio (first over second), the predicted one, whether the planner orders them as published, and whether both
    ran on as many GPUs (then only the strategy, the precision or the link differs: the harder pairs, where
    more GPUs alone do not tell the order)."""
    rows = []
    usable = predicted[predicted["predicted_tokens_per_s"].notna() & predicted["published_tokens_per_s"].notna()]
    for group, members in usable.groupby("group", sort=False):
        for a, b in itertools.combinations(members.itertuples(index=False), 2):
            published = a.published_tokens_per_s / b.published_tokens_per_s
            if abs(published - 1) <= TIE:
                continue
            modelled = a.predicted_tokens_per_s / b.predicted_tokens_per_s
            rows.append({"group": group, "first": a.row, "second": b.row, "published_ratio": published,
                         "predicted_ratio": modelled, "ordered": (published > 1) == (modelled > 1),
                         "same_gpus": a.gpus == b.gpus})
    return pd.DataFrame(rows, columns=["group", "first", "second", "published_ratio", "predicted_ratio", "ordered",
                                       "same_gpus"])


def centred_mfu(table: pd.DataFrame, mfu: float, predicted: pd.DataFrame) -> tuple[float, pd.DataFrame]:
    """The MFU at which the predicted throughputs' median error is zero (to 0.5%), found by scaling the MFU by the
    median error until it is, and the predictions there: the frameworks' typical efficiency, so that the errors
    left are the model's spread, not the assumed MFU's. NaN where no row is predicted."""
    for _ in range(10):
        ratio = (1 + predicted["throughput_error"].dropna()).median()
        if math.isnan(ratio) or abs(ratio - 1) < 0.005 or mfu == 1.0:
            break
        mfu = min(1.0, mfu / ratio)
        predicted = predictions(table, mfu)
    return (math.nan if math.isnan(ratio) else mfu), predicted


def error_summary(predicted: pd.DataFrame, ordered: pd.DataFrame) -> dict[str, float | int]:
    """The numbers the planner quotes: rows predicted, pairs ordered as published, the throughput's median and
    worst |error|, the memory's where the peak allocated was published, and how many of the devices' published
    use the prediction stays below."""
    throughput = predicted["throughput_error"].dropna()
    memory = predicted.loc[predicted["memory_measure"] == ALLOCATED, "memory_error"].dropna()
    device = predicted.loc[predicted["memory_measure"] == DEVICE, "memory_error"].dropna()

    def worst(errors: pd.Series) -> float:
        return float(errors.loc[errors.abs().idxmax()]) if len(errors) else math.nan

    return {"rows": len(predicted), "predicted_rows": int(predicted["predicted_tokens_per_s"].notna().sum()),
            "groups": int(predicted.loc[predicted["predicted_tokens_per_s"].notna(), "group"].nunique()),
            "pairs": len(ordered), "pairs_ordered": int(ordered["ordered"].sum()),
            "same_gpus_pairs": int(ordered["same_gpus"].sum()),
            "same_gpus_pairs_ordered": int((ordered["same_gpus"] & ordered["ordered"]).sum()),
            "throughput_median_abs_error": float(throughput.abs().median()) if len(throughput) else math.nan,
            "throughput_worst_error": worst(throughput), "memory_rows": len(memory),
            "memory_median_abs_error": float(memory.abs().median()) if len(memory) else math.nan,
            "memory_worst_error": worst(memory), "device_rows": len(device),
            "device_rows_below": int((device < 0).sum())}


def validation(table: pd.DataFrame, mfu: float) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, float | int]]:
    """A table's predictions at `mfu`, its pairs, and error_summary with the throughput's median |error| at the
    centred MFU."""
    predicted = predictions(table, mfu)
    ordered = pairs(predicted)
    centred, at_centred = centred_mfu(table, mfu, predicted)
    return predicted, ordered, error_summary(predicted, ordered) | {
        "centred_mfu": centred, "centred_median_abs_error": float(at_centred["throughput_error"].abs().median())}


def published_summary(mfu: float) -> dict[str, float | int]:
    """validation's summary of the repository's table."""
    return validation(read_table(), mfu)[2]


def summary_words(summary: dict) -> str:
    """One sentence a GPU prediction is quoted with."""
    share = f" ({summary['pairs_ordered'] / summary['pairs']:.0%})" if summary["pairs"] else ""
    memory = (f"; its memory by {summary['memory_median_abs_error']:.0%} (median) to "
              f"{summary['memory_worst_error']:+.0%} where {summary['memory_rows']} row(s) give the peak allocated"
              if summary["memory_rows"] else "")
    if summary["device_rows"]:
        memory += (f", and below the device's use (nvidia-smi) in {summary['device_rows_below']} of "
                   f"{summary['device_rows']} rows that give that")
    centred = (f" (at {summary['centred_mfu']:.0%} MFU, the frameworks' median, by "
               f"{summary['centred_median_abs_error']:.0%})" if not math.isnan(summary["centred_mfu"]) else "")
    return (f"held to {summary['predicted_rows']} published GPU measurements in {summary['groups']} group(s) "
            f"(gpt2dist validate-published), the planner orders {summary['pairs_ordered']} of {summary['pairs']} "
            f"same-machine pairs as published{share}, {summary['same_gpus_pairs_ordered']} of "
            f"{summary['same_gpus_pairs']} of those on as many GPUs; its throughput is off by "
            f"{summary['throughput_median_abs_error']:.0%} (median) to {summary['throughput_worst_error']:+.0%}"
            + centred + memory)
