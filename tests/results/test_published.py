"""The planner held to published GPU measurements: the table's rows read back as the planner's inputs, its
conversions to seconds per step, and `gpt2dist validate-published`'s verdicts, a wrongly ordered pair reported."""

from __future__ import annotations

import io
import re

import pandas as pd
import pytest
from conftest import gpt2dist

from gpt2dist.results.published import COLUMNS, TABLE, pairs, predictions, read_table, row_spec, validation


def test_every_row_names_its_source_and_reads_back_as_the_planners_input():
    table = read_table()
    assert len(table) >= 15 and table["source"].nunique() >= 5  # issue 51's floor
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


def test_every_row_in_the_registry_is_predicted_or_says_why_not():
    predicted = predictions(read_table(), 0.4)
    left_out = predicted["left_out"] != ""
    assert predicted.loc[~left_out, "predicted_tokens_per_s"].gt(0).all()
    assert predicted.loc[left_out, "left_out"].str.match("outside the registry: |refused by the planner: ").all()
    assert (predicted["outside"] != "").sum() <= left_out.sum() < len(predicted) / 4


def fixture_table(tmp_path, swap: bool):
    """Two rows of the ship's table, ddp over an NVLink bridge and through host memory (peer-to-peer off) on one
    machine; `swap` gives each the other's published time, an ordering the planner cannot share: more bandwidth
    is never slower in its model."""
    rows = read_table().set_index("row").loc[["R010", "R011"]].reset_index()
    if swap:
        rows["step_s"] = rows["step_s"].iloc[::-1].to_numpy()
    path = tmp_path / "published.csv"
    rows.to_csv(path, index=False)
    return path


@pytest.mark.parametrize("swap", [False, True])
def test_the_command_reports_each_pairs_order_and_a_wrong_one_by_name(tmp_path, swap):
    path = fixture_table(tmp_path, swap)
    shown = gpt2dist("validate-published", "--table", path).stdout
    assert "| R010 " in shown and "| R011 " in shown
    words = " ".join(shown.split())  # unwrapped
    verdict = re.search(r"hf-2x-rtx-3090-medium: (\d) of (\d) pairs ordered as published"
                        r"(; not: R010 / R011 published (\d\.\d\d), predicted (\d\.\d\d))?", words)
    assert verdict, shown
    if swap:  # the control: the planner's ordering is reported as wrong, with both ratios
        assert verdict.group(1, 2) == ("0", "1") and float(verdict[4]) < 1 < float(verdict[5]), verdict.group(0)
    else:
        assert verdict.group(1, 2) == ("1", "1") and verdict[3] is None, verdict.group(0)
    csv = pd.read_csv(io.StringIO(gpt2dist("validate-published", "--table", path, "--format", "csv").stdout))
    assert list(csv["row"]) == ["R010", "R011"] and csv["throughput_error"].notna().all()


def test_memory_is_held_to_the_peak_allocated_and_kept_below_the_devices_use():
    table = read_table()
    predicted, _, summary = validation(table, 0.4)
    allocated = predicted[predicted["memory_measure"] == "allocated"].dropna(subset=["memory_error"])
    device = predicted[predicted["memory_measure"] == "device"].dropna(subset=["memory_error"])
    assert summary["memory_rows"] == len(allocated) >= 1 and summary["device_rows"] == len(device) >= 1
    assert summary["memory_median_abs_error"] == pytest.approx(allocated["memory_error"].abs().median())
    assert summary["device_rows_below"] == (device["memory_error"] < 0).sum()
    assert set(table.loc[table["memory_gib"].notna(), "memory_measure"]) == {"allocated", "device"}
    assert (table.loc[table["memory_gib"].isna(), "memory_measure"] == "").all()
    # the control: a device's use read as the peak allocated counts in the error, and moves it
    mixed = table.assign(memory_measure=table["memory_measure"].replace("device", "allocated"))
    assert validation(mixed, 0.4)[2]["memory_rows"] == len(allocated) + len(device)


def test_the_centred_mfu_takes_the_assumed_mfus_share_out_of_the_error():
    _, _, at_40 = validation(read_table(), 0.4)
    _, _, at_80 = validation(read_table(), 0.8)
    assert at_40["centred_mfu"] == pytest.approx(at_80["centred_mfu"], rel=0.01)  # the frameworks', not ours
    centred = predictions(read_table(), at_40["centred_mfu"])
    assert (1 + centred["throughput_error"].dropna()).median() == pytest.approx(1, abs=0.005)
    assert at_40["centred_median_abs_error"] < at_40["throughput_median_abs_error"]


def test_ties_are_not_counted_and_a_pair_spans_one_group_only():
    predicted = predictions(read_table(), 0.4)
    counted = pairs(predicted)
    assert (abs(counted["published_ratio"] - 1) > 0.03).all()
    groups = predicted.set_index("row")["group"]
    assert (counted["first"].map(groups) == counted["second"].map(groups)).all()


@pytest.mark.parametrize("change, message", [
    (lambda table: table.drop(columns="gpus"), "no column gpus; write it in the columns of published_gpt2.csv"),
    (None, "no such file"),
    (b"\x89PNG\r\n\x1a\n\x00\xff\xfe", "not a CSV table; write it in the columns of published_gpt2.csv"),
    (b"", "not a CSV table; write it in the columns of published_gpt2.csv"),
])
def test_a_table_of_another_layout_is_one_error_line(tmp_path, change, message):
    path = tmp_path / "table.csv"
    if isinstance(change, bytes):  # a file of another kind, or an empty one
        path.write_bytes(change)
    elif change:
        change(read_table()).to_csv(path, index=False)
    result = gpt2dist("validate-published", "--table", path, check=False)
    assert result.returncode == 2 and result.stderr.strip() == f"error: --table {path}: {message}", result.stderr


def test_a_row_the_registry_refuses_is_left_out_saying_why(tmp_path):
    rows = read_table().head(2).assign(strategy=["ddp", "zero3"])
    predicted = predictions(rows, 0.4)
    assert predicted.loc[1, "left_out"].startswith("refused by the planner: ") and "zero3" in predicted.loc[1, "left_out"]
    assert set(COLUMNS) <= set(pd.read_csv(TABLE).columns)
