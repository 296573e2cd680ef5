"""The planner held to published GPU measurements: the table's rows read back as the planner's inputs, every cell
checked, its conversions to seconds per step, the GPU step model's constants fitted out of source (no source tunes
its own prediction), the shipped fit kept equal to the table's, the searches' picks scored, and `gpt2dist
validate-published`'s verdicts, a wrongly ordered pair reported."""

from __future__ import annotations

import io
import json
import re

import numpy as np
import pandas as pd
import pytest
from conftest import REPO, gpt2dist

from gpt2dist.config.strategies import describe
from gpt2dist.forecast.gpu_step import Constants, StepWorks
from gpt2dist.forecast.published import (BOUNDS, COLUMNS, FIT, SEARCH_KEYS, TABLE, error_summary, pairs, predictions,
                                        read_table, row_spec, row_works, searches, validation)


@pytest.fixture(scope="module")
def validated():
    return validation(read_table())


def test_every_row_names_its_source_and_reads_back_as_the_planners_input():
    table = read_table()
    assert len(table) >= 90 and table["source"].nunique() >= 10
    assert table["row"].is_unique and (table["where"] != "").all() and (table["conversion"] != "").all()
    for row in table[table["outside"] == ""].itertuples(index=False):
        spec = row_spec(pd.Series(row._asdict()))
        m, t = spec.model, spec.train
        assert (m.n_layer, m.n_head, m.n_embd, m.n_positions) == (row.n_layer, row.n_head, row.n_embd, row.seq_len)
        assert (spec.strategy, spec.precision, spec.nproc, spec.nodes) == (row.strategy, row.precision, row.gpus,
                                                                          row.nodes)
        assert (t.global_batch_size, t.micro_batch_size, t.activation_checkpointing) == (
            row.global_batch, row.micro_batch, row.checkpointing)
    # the conversions, checked on one row of each kind against the number as published
    published = table.set_index("row")
    assert published.loc["R001", "step_s"] == pytest.approx(110.5948 / 200)  # train_runtime of 200 steps
    assert published.loc["R045", "step_s"] == pytest.approx(32 / 198.6)  # samples/s at a global batch of 32
    assert published.loc["R097", "step_s"] == pytest.approx(512 * 2048 / (140438 * 8))  # tokens/s per GPU
    assert published.loc["R241", "step_s"] == pytest.approx(128 * 1024 / 489270)  # this engine on an H200


def test_every_row_a_published_system_ran_is_predicted(validated):
    """Fewer micro-batches than pipeline stages (Megatron runs them; torch's 1F1B refuses them) and tensor
    parallelism across nodes (slow, which is the answer) are priced, not refused: only a row outside the registry is
    left out, saying why."""
    predicted, _, _, summary = validated
    left_out = predicted["left_out"] != ""
    assert predicted.loc[~left_out, "predicted_tokens_per_s"].gt(0).all()
    assert (predicted.loc[~left_out, "fitted_without"] == predicted.loc[~left_out, "source"]).all()
    assert predicted.loc[left_out, "left_out"].str.startswith("outside the registry: ").all()
    assert left_out.sum() == (predicted["outside"] != "").sum() == 2
    assert summary["sources"] == predicted.loc[~left_out, "source"].nunique()
    degrees = [describe(row.strategy).degrees(row.gpus, row_spec(pd.Series(row._asdict())).train)
               for row in predicted[~left_out].itertuples(index=False)]
    short = [d.pp > 1 and d.pipeline_micro_batches < d.pp for d in degrees]
    assert sum(short) >= 96  # vTrain's 96 and AMP's, refused before this model priced their bubble


def test_no_source_tunes_its_own_prediction(validated):
    """Each source's rows are predicted with the constants fitted to every other source's: doubling one source's
    published times moves its own predictions not at all and every other source's. The control: fitted to every
    row, as plan uses them, its own predictions move too."""
    table = read_table()
    source = "Oneflow-Inc/DLPerf"
    slower = table.assign(step_s=np.where(table["source"] == source, table["step_s"] * 2, table["step_s"]))
    before, _, _, summary = validated
    fits = {"all": Constants(**summary["constants"])} | {
        name: Constants(**constants) for name, constants in summary["without_source"].items()}
    after, fits_after = predictions(slower)
    own, others = before["source"] == source, (before["source"] != source) & before["predicted_step_s"].notna()
    assert np.allclose(before.loc[own, "predicted_step_s"], after.loc[own, "predicted_step_s"], rtol=1e-9,
                       equal_nan=True)
    assert not np.allclose(before.loc[others, "predicted_step_s"], after.loc[others, "predicted_step_s"], rtol=1e-3)
    assert fits[source] == fits_after[source] and fits["all"] != fits_after["all"]
    own_works = [work for work, of in zip(row_works(table), table["source"])
                 if of == source and not isinstance(work, str)]
    in_sample = [[work.terms(constants).total_s for work in own_works] for constants in (fits["all"],
                                                                                         fits_after["all"])]
    assert not np.allclose(*in_sample, rtol=1e-3)


def test_the_fitted_constants_are_physical_and_the_shipped_fit_is_the_tables(validated):
    """Every fit keeps each constant in its physical range (BOUNDS); gpu_fit.json, which plan and recommend read, is
    the fit of the shipped table and its out-of-source error, not a number edited by hand (rewrite it with
    `gpt2dist validate-published --write-fit src/gpt2dist/forecast/gpu_fit.json`)."""
    _, _, _, summary = validated
    for constants in [summary["constants"], *summary["without_source"].values()]:
        assert set(constants) == set(Constants.NAMES)
        assert all(BOUNDS[name][0] <= value <= BOUNDS[name][1] for name, value in constants.items()), constants
    shipped = json.loads(FIT.read_text())
    assert shipped.keys() == summary.keys()
    for key, value in summary.items():
        if isinstance(value, float):
            assert shipped[key] == pytest.approx(value, rel=1e-3, abs=1e-9), key
        elif key == "constants":
            assert shipped[key] == pytest.approx(value, rel=1e-3), key
        elif key != "without_source":
            assert shipped[key] == value, key


def test_the_published_error_meets_the_planners_targets_on_the_table_they_were_set_for(validated):
    """Issue 70's bar, out of source, on the rows it was set for (R001-R245, before the sweeps of issue 85): the
    throughput's median error within 20%, 95% of same-machine pairs ordered (90% of those on as many GPUs), the
    ratio of two rows within 10% (median), memory within 15% where the peak allocated is published. The control:
    the planner before (compute at an assumed MFU of 40%) misses the throughput and the pairs on as many GPUs on
    the same rows, and its ratios' 95th percentile error is larger than ours."""
    predicted = validated[0]
    first = predicted[predicted["row"].str.startswith("R")]
    summary = error_summary(first, pairs(first), searches(first))
    assert summary["throughput_median_abs_error"] <= 0.20
    assert summary["pairs_ordered"] >= 0.95 * summary["pairs"]
    assert summary["same_gpus_pairs_ordered"] >= 0.90 * summary["same_gpus_pairs"]
    assert summary["ratio_median_abs_error"] <= 0.10
    assert summary["memory_rows"] >= 4 and summary["memory_median_abs_error"] <= 0.15
    assert abs(summary["memory_worst_error"]) <= 0.15
    table = read_table()
    before = validation(table[table["row"].str.startswith("R")], 0.4)[3]
    assert before["throughput_median_abs_error"] > 0.20
    assert before["same_gpus_pairs_ordered"] < 0.90 * before["same_gpus_pairs"]
    assert before["ratio_high_abs_error"] > summary["ratio_high_abs_error"]


def test_a_search_scores_the_pick_against_the_fastest_measured(validated):
    """Rows of one machine, model, GPU count, batch and program form a search; its pick (the predicted fastest) is
    the fastest where measured within 2% of it, near within 5%, and its regret is its measured step over the
    fastest's. On three rows of one search: a pick 1% slower than the fastest measured is a hit; the control, the
    same pick measured 4% and then 20% slower, is near and then a miss, with those regrets. A fourth row of another
    GPU count is a search of its own, of one row: none."""
    rows = pd.DataFrame({"row": ["a", "b", "c", "d"], "strategy": ["ddp", "ddp-tp2", "pp", "ddp"],
                         "micro_batch": [1, 2, 4, 1], "gpus": [8, 8, 8, 4], "predicted_step_s": [1.0, 1.2, 1.5, 1.0]})
    rows = rows.assign(**{key: 1 for key in SEARCH_KEYS if key not in rows})
    for pick_s, top1, within in ((1.01, True, True), (1.04, False, True), (1.2, False, False)):
        scored = searches(rows.assign(step_s=[pick_s, 1.0, 1.3, 0.5]))
        assert len(scored) == 1 and scored.loc[0, ["pick", "fastest"]].tolist() == ["a", "b"]
        assert (scored.loc[0, "top1"], scored.loc[0, "within"]) == (top1, within)
        assert scored.loc[0, "regret"] == pytest.approx(pick_s)
    _, _, searched, summary = validated  # the shipped table's, as validate-published counts them
    assert summary["searches"] == len(searched) >= 150 and (searched["rows"] >= 2).all()
    assert summary["searches_top1"] == searched["top1"].sum() and summary["searches_within"] == searched["within"].sum()
    assert (searched["regret"] >= 1).all() and summary["regret_worst"] == searched["regret"].max()


def test_the_batch_prices_every_row_as_one_row_is_priced(validated):
    """The fit prices all rows at once (StepWorks); each row alone (StepWork.terms) gives the same step."""
    works = [work for work in row_works(read_table()) if not isinstance(work, str)]
    constants = Constants(**validated[3]["constants"])
    assert StepWorks(works).totals(constants) == pytest.approx([work.terms(constants).total_s for work in works],
                                                                rel=1e-12)


def test_a_micro_batch_moves_the_prediction_as_the_operations_say():
    """This engine's H200 row at 16 sequences per micro-batch, run again at 64 with the same global batch: the step
    model counts the same tokens' work, fewer launches and less of the host's dispatch, so the step shortens by what
    those cost (the published step shortened 4%). The control: at an assumed MFU the step is the global batch's
    FLOPs, whatever the micro-batch."""
    table = read_table()
    row = table[table["row"] == "R240"]
    wider = row.assign(micro_batch=64)
    work, wide_work = row_works(row)[0], row_works(wider)[0]
    constants = Constants(**json.loads(FIT.read_text())["constants"])
    fewer_passes = work.passes / wide_work.passes
    assert fewer_passes == 4 and wide_work.micro.kernels == work.micro.kernels  # a pass's kernels, four times fewer
    step, wide_step = work.terms(constants).total_s, wide_work.terms(constants).total_s
    launches = (work.passes - wide_work.passes) * work.micro.kernels * constants.kernel_s
    assert 0 < step - wide_step and step - wide_step >= launches * 0.99  # at least the launches saved
    assert row_works(row.assign(micro_batch=32))[0].terms(constants).total_s > wide_step  # between the two
    at_mfu = [predictions(rows, 0.4)[0]["predicted_step_s"].iloc[0] for rows in (row, wider)]
    assert at_mfu[0] == at_mfu[1]


def fixture_table(tmp_path, swap: bool):
    """Two rows of the ship's table, ddp over an NVLink bridge and through host memory (peer-to-peer off) on one
    machine, and another source's three to fit the constants to; `swap` gives the two the other's published time,
    an ordering the planner cannot share: more bandwidth is never slower in its model."""
    rows = read_table().set_index("row").loc[["R010", "R011", "R001", "R002", "R003"]].reset_index()
    if swap:
        rows.loc[:1, "step_s"] = rows.loc[:1, "step_s"].iloc[::-1].to_numpy()
    path = tmp_path / "published.csv"
    rows.to_csv(path, index=False)
    return path


@pytest.mark.parametrize("swap", [False, True])
def test_the_command_reports_each_pairs_order_and_a_wrong_one_by_name(tmp_path, swap):
    path = fixture_table(tmp_path, swap)
    shown = gpt2dist("validate-published", "--table", path).stdout
    group = next(line for line in shown.splitlines() if line.startswith("| hf-2x-rtx-3090-medium "))
    assert [cell.strip() for cell in group.strip("|").split("|")][6] == ("0/1" if swap else "1/1"), group
    words = " ".join(shown.split())  # unwrapped
    wrong = re.search(r"hf-2x-rtx-3090-medium: 0 of 1 pairs ordered as published, their ratio off by \d+% \(median\); "
                      r"not: R010 / R011 published (\d\.\d\d), predicted (\d\.\d\d)", words)
    if swap:  # the control: the planner's ordering is reported as wrong, with both ratios
        assert wrong and float(wrong[1]) < 1 < float(wrong[2]), words
    else:
        assert wrong is None and "R010 / R011" not in words
    csv = pd.read_csv(io.StringIO(gpt2dist("validate-published", "--table", path, "--format", "csv").stdout))
    assert list(csv["row"]) == ["R010", "R011", "R001", "R002", "R003"] and csv["throughput_error"].notna().all()


def test_memory_is_held_to_the_peak_allocated_and_kept_below_the_devices_use(validated):
    table = read_table()
    predicted, _, _, summary = validated
    allocated = predicted[predicted["memory_measure"] == "allocated"].dropna(subset=["memory_error"])
    device = predicted[predicted["memory_measure"] == "device"].dropna(subset=["memory_error"])
    assert summary["memory_rows"] == len(allocated) >= 4 and summary["device_rows"] == len(device) >= 1
    assert summary["memory_median_abs_error"] == pytest.approx(allocated["memory_error"].abs().median())
    assert summary["device_rows_below"] == (device["memory_error"] < 0).sum()
    assert set(table.loc[table["memory_gib"].notna(), "memory_measure"]) == {"allocated", "device"}
    assert (table.loc[table["memory_gib"].isna(), "memory_measure"] == "").all()
    # the control: a device's use read as the peak allocated counts in the error, and moves it
    mixed = table.assign(memory_measure=table["memory_measure"].replace("device", "allocated"))
    assert validation(mixed, 0.4)[3]["memory_rows"] == len(allocated) + len(device)


def test_ties_are_not_counted_and_a_pair_spans_one_group_only(validated):
    predicted, counted, _, _ = validated
    assert (abs(counted["published_ratio"] - 1) > 0.03).all()
    groups = predicted.set_index("row")["group"]
    assert (counted["first"].map(groups) == counted["second"].map(groups)).all()
    assert counted["ratio_error"].to_numpy() == pytest.approx(
        (counted["predicted_ratio"] / counted["published_ratio"] - 1).to_numpy())
    assert pairs(predicted.assign(group=predicted["row"])).empty  # the control: a row alone makes no pair


@pytest.mark.parametrize("change, message", [
    (lambda table: table.drop(columns="gpus"), "no column gpus; write it in the columns of published_gpt2.csv"),
    (lambda table: table.drop(columns="implementation"),
     "no column implementation; write it in the columns of published_gpt2.csv"),
    (None, "no such file"),
    (b"\x89PNG\r\n\x1a\n\x00\xff\xfe", "not a CSV table; write it in the columns of published_gpt2.csv"),
    (b"", "not a CSV table; write it in the columns of published_gpt2.csv"),
])
@pytest.mark.parametrize("option", ["--table", "--add"])
def test_a_table_of_another_layout_is_one_error_line(tmp_path, change, message, option):
    """As the table, so the rows --add brings beside it: each file is read and checked alike."""
    path = tmp_path / "table.csv"
    if isinstance(change, bytes):  # a file of another kind, or an empty one
        path.write_bytes(change)
    elif change:
        change(read_table()).to_csv(path, index=False)
    result = gpt2dist("validate-published", option, path, check=False)
    assert result.returncode == 2 and result.stderr.strip() == f"error: {option} {path}: {message}", result.stderr


def test_a_row_the_planner_refuses_is_left_out_saying_why():
    """Degrees that no system could run (tensor parallelism over more ranks than the heads divide into) are the
    planner's refusal, said with the row."""
    rows = read_table().head(3).assign(strategy=["ddp", "tp", "ddp"], gpus=[2, 5, 2], gpus_per_node=[2, 5, 2])
    predicted, _ = predictions(rows, 0.4)
    assert predicted.loc[1, "left_out"].startswith("refused by the planner: ") and "n_head" in predicted.loc[1, "left_out"]
    assert (predicted.loc[[0, 2], "left_out"] == "").all() and set(COLUMNS) <= set(pd.read_csv(TABLE).columns)


# A bad cell of each column, and what the error says of it
BAD_CELLS = [(column, value) for column in ("gpus", "gpus_per_node", "nodes", "nics", "n_layer", "n_head", "n_embd",
                                            "seq_len", "vocab", "micro_batch", "global_batch")
             for value in ("", "nan", "inf", "-1", "0", "1.5", "two")]
BAD_CELLS += [("step_s", value) for value in ("", "nan", "inf", "-0.2", "0", "fast")]
BAD_CELLS += [("memory_gib", value) for value in ("nan", "inf", "-3", "0", "lots")]
BAD_CELLS += [(column, value) for column in ("link_inside", "link_across", "precision", "checkpointing", "gpu",
                                             "strategy", "implementation") for value in ("", "nvlink9-warp")]
BAD_CELLS += [(column, "") for column in ("row", "source", "where", "group", "conversion")]
BAD_CELLS += [("memory_measure", "peak"), ("memory_measure", "")]


@pytest.mark.parametrize("column, value", BAD_CELLS)
def test_a_bad_cell_is_one_error_naming_its_row_and_column(tmp_path, column, value):
    """Every column's cells are checked as they are read: an empty, NaN, infinite, negative, zero or unknown cell
    ends the command with one line naming the row, the column and what the column allows, and prints no verdict.
    The control (the first case): the same table untouched is read."""
    table = pd.read_csv(TABLE, dtype=str, keep_default_na=False).head(6)
    row = 4 if column != "memory_measure" else 5  # R005 names no memory; R006 names no memory either
    if column == "memory_measure" and value == "":  # a memory without what measured it
        table.loc[row, "memory_gib"] = "3.0"
    table.loc[row, column] = value
    path = tmp_path / "table.csv"
    table.to_csv(path, index=False)
    result = gpt2dist("validate-published", "--table", path, "--mfu", "0.4", check=False)
    assert result.returncode == 2 and result.stdout == "", result.stdout
    assert result.stderr.startswith(f"error: --table {path}: row {table.loc[row, 'row'] or row + 1} (line {row + 2}), "
                                    f"column {column}: ") and len(result.stderr.strip().splitlines()) == 1, result.stderr
    if (column, value) == BAD_CELLS[0]:
        assert gpt2dist("validate-published", "--table", tmp_path / "untouched.csv", "--mfu", "0.4", check=False,
                        ).returncode == 2  # no such file: the control is the table below
        pd.read_csv(TABLE, dtype=str, keep_default_na=False).head(6).to_csv(tmp_path / "untouched.csv", index=False)
        assert gpt2dist("validate-published", "--table", tmp_path / "untouched.csv", "--mfu", "0.4").returncode == 0


def test_a_table_of_only_its_header_is_one_error(tmp_path):
    path = tmp_path / "header.csv"
    pd.read_csv(TABLE, dtype=str, keep_default_na=False).head(0).to_csv(path, index=False)
    result = gpt2dist("validate-published", "--table", path, check=False)
    assert result.returncode == 2 and result.stderr.strip() == (
        f"error: --table {path}: no rows under its header; add a measurement in the columns of published_gpt2.csv")


@pytest.fixture(scope="module")
def gpu_tune(tmp_path_factory):
    """A tune of 8 H100s as planned (a dry run) and a measurement as its study would collect it: the planner's pick
    1.3x its predicted step, every other candidate 0-13% over its own (made up; a lent GPU measures one with
    bench/gpu_campaign.sh's tune step)."""
    from gpt2dist.results.tune import beside, config_of

    out = tmp_path_factory.mktemp("tune")
    gpt2dist("tune", "--gpus", "8", "--gpu", "H100", "--dry-run", "--out", out / "tune", cwd=REPO)
    plan = json.loads((out / "tune" / "results" / "tune.json").read_text())
    splits = {row["strategy"]: row for row in plan["splits"]}
    over = {name: 1.3 if name == plan["pick"] else 1 + 0.01 * i for i, name in enumerate(plan["candidates"])}
    summary = {"hardware": "8x NVIDIA H100 80GB HBM3", "configs": {
        config_of(plan, name): {"step_time_s": splits[name]["step_s"] * over[name], "repeats": 3,
                                "peak_mem_bytes": splits[name]["peak_gib"] * 2**30} for name in plan["candidates"]}}
    return plan, summary, beside(summary, plan), out


def test_a_gpu_tunes_measured_splits_are_held_out_of_source_as_a_search_of_their_own(gpu_tune):
    """A tune on GPUs writes its measured splits as rows of the table (measured.csv). Added to the shipped table they
    are predicted with the constants fitted to every other source, the shipped fit the tune planned with, so each
    row's prediction is the tune's own (every column carries the setup the tune ran), and they form one search whose
    pick is the tune's, scored against what was measured. Controls: a row with its micro-batch halved is predicted
    otherwise, and a tune on CPUs writes no rows (the GPU step model predicts GPUs)."""
    from gpt2dist.forecast.published import read_tables
    from gpt2dist.results.tune import measured_rows

    plan, summary, rows, out = gpu_tune
    path = out / "measured.csv"
    measured_rows(plan, summary, rows).to_csv(path, index=False)
    table = read_tables(TABLE, [path])
    added = table["source"] == f"gpt2dist tune {plan['started_at']}"
    assert added.sum() == len(plan["candidates"]) and table[~added].equals(read_table())
    predicted, _, searched, _ = validation(table)
    mine = predicted[added.to_numpy()].set_index("strategy")
    assert (mine["left_out"] == "").all() and (mine["fitted_without"] == f"gpt2dist tune {plan['started_at']}").all()
    steps = {row["strategy"]: row["step_s"] for row in plan["splits"]}
    assert mine["predicted_step_s"].to_numpy() == pytest.approx(mine.index.map(steps).to_numpy(), rel=1e-4)
    search = searched[searched["group"] == mine["group"].iloc[0]].squeeze()
    fastest = min(rows, key=lambda row: row["measured_step_s"])
    assert search["rows"] == len(plan["candidates"]) and search["pick_strategy"] == plan["pick"]
    assert search["fastest_strategy"] == fastest["strategy"] and not search["top1"]
    assert search["regret"] == pytest.approx(1.3 * steps[plan["pick"]] / fastest["measured_step_s"])
    halved = predictions(table.assign(micro_batch=np.where(added, table["micro_batch"] // 2, table["micro_batch"])))[0]
    assert not np.allclose(halved[added.to_numpy()]["predicted_step_s"], mine["predicted_step_s"], rtol=1e-3)
    assert measured_rows(plan | {"cluster": plan["cluster"] | {"device": "cpu"}}, summary, rows) is None


def test_added_rows_are_refused_in_one_line_where_missing_or_named_twice(gpu_tune):
    """validate-published --add: the added rows' group is reported beside the shipped ones and the table named with
    them; a file that is not there, or added twice (its rows named twice), is one error line."""
    from gpt2dist.results.tune import measured_rows

    plan, summary, rows, out = gpu_tune
    path = out / "added.csv"
    measured_rows(plan, summary, rows).to_csv(path, index=False)
    said = gpt2dist("validate-published", "--add", path).stdout
    assert re.search(rf"^\| tune-1x8-H100-{re.escape(plan['started_at'])} +\| H100 +\| gpt2dist +\| "
                     rf"{len(plan['candidates'])} ", said, re.M), said
    assert f"with the rows of {path}" in " ".join(said.split())
    twice = gpt2dist("validate-published", "--add", path, "--add", path, check=False)
    assert twice.returncode == 2 and twice.stderr.startswith(f"error: --add {path}: row 'gpt2dist tune ") and (
        f"is also in {path}; give each row its own name, or add the file once" in twice.stderr), twice.stderr
    missing = gpt2dist("validate-published", "--add", out / "none.csv", check=False)
    assert missing.returncode == 2 and missing.stderr.strip() == f"error: --add {out / 'none.csv'}: no such file"
    bad = out / "bad.csv"  # a cell its column does not allow, named with the option that brought it
    measured_rows(plan, summary, rows).assign(step_s="nan").to_csv(bad, index=False)
    refused = gpt2dist("validate-published", "--add", bad, check=False)
    assert refused.returncode == 2 and refused.stdout == "", refused.stdout
    assert refused.stderr.startswith(f"error: --add {bad}: row gpt2dist tune ") and (
        "column step_s: 'nan' is not a number of seconds" in refused.stderr), refused.stderr
