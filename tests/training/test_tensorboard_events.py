"""Every run's curves in TensorBoard: its event file, read back with TensorBoard's own reader, holds each line of
metrics.jsonl at its step (float32, as TensorBoard keeps scalars), a resumed run's the whole curve, and its bytes are
those TensorBoard's own writer makes of the same events."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import TENSORS, EventAccumulator
from tensorboard.backend.event_processing.event_file_loader import LegacyEventFileLoader
from tensorboard.backend.event_processing.plugin_event_multiplexer import EventMultiplexer
from tensorboard.compat.proto.event_pb2 import Event
from tensorboard.plugins.scalar.summary_v2 import scalar_pb
from tensorboard.summary.writer.record_writer import RecordWriter
from tensorboard.util.tensor_util import make_ndarray

from gpt2dist.pipeline.layout import EVENTS
from gpt2dist.training.tensorboard_events import write_events

from conftest import gpt2dist, kill_forked_ranks_after_checkpoint, read_metrics, train_args

LEDGER_PARTS = ("compute_s", "comm_hidden_s", "comm_exposed_s", "data_s", "idle_s")


def read_curves(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Each tag's (step, value) points in the run directory's event files, read by TensorBoard's reader."""
    events = EventAccumulator(str(run_dir), size_guidance={TENSORS: 0})  # 0: every point, not a sample of them
    events.Reload()
    return {tag: [(event.step, float(make_ndarray(event.tensor_proto))) for event in events.Tensors(tag)]
            for tag in events.Tags()["tensors"]}


def curves_of_metrics(lines: list[dict]) -> dict[str, list[tuple[int, float]]]:
    """What the event file should hold, from metrics.jsonl's lines: the loss, gradient norm, learning rate,
    throughput, step time and peak memory of every step, each validation loss, and the ledger's parts of each traced
    step (its per_step entries, in the order of the steps marked traced)."""
    train = [line for line in lines if line["kind"] == "train"]
    curves = {f"train/{key}": [(line["step"], line[key]) for line in train]
              for key in ("loss", "grad_norm", "lr", "tokens_per_s", "step_time_s", "peak_mem_bytes")}
    curves["eval/val_loss"] = [(line["step"], line["val_loss"]) for line in lines if line["kind"] == "eval"]
    ledger = next(line for line in lines if line["kind"] == "ledger")
    traced = [line["step"] for line in train if line.get("traced")]
    for part in LEDGER_PARTS:
        curves[f"ledger/{part}"] = [(step, parts[part]) for step, parts in zip(traced, ledger["per_step"])]
    return {tag: [(step, float(np.float32(value))) for step, value in points] for tag, points in curves.items()}


def all_lines(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_the_event_file_holds_every_line_of_metrics_jsonl(trained, tmp_path):
    run = trained("ddp", nproc=2)
    lines = all_lines(run)
    expected = curves_of_metrics(lines)
    assert len(expected["train/loss"]) == 12 and len(expected["eval/val_loss"]) == 2
    assert len(expected["ledger/compute_s"]) == 2  # the tiny preset traces its last two steps
    assert read_curves(run) == expected
    # control: the event file of a history with one step's loss changed is told apart
    changed = [dict(line, loss=line["loss"] + 1e-3) if line["kind"] == "train" and line["step"] == 5 else line
               for line in lines]
    write_events(tmp_path / EVENTS, changed)
    assert read_curves(tmp_path) != expected and read_curves(tmp_path)["train/loss"][5] != expected["train/loss"][5]


def tensorboards_bytes(path: Path) -> bytes:
    """The file TensorBoard's own writer makes of the events in `path`, read in the file's order: each as its Event
    message of the same wall time and step, holding what its scalar helper makes of the same tag and value (the first,
    the file version), in its record writer's framing."""
    with io.BytesIO() as handle:
        writer = RecordWriter(handle)
        for read in LegacyEventFileLoader(str(path)).Load():  # as written: no compatibility layer between
            if read.HasField("summary"):
                (value,) = read.summary.value
                again = Event(wall_time=read.wall_time, step=read.step,
                              summary=scalar_pb(value.tag, float(make_ndarray(value.tensor))))
            else:
                again = Event(wall_time=read.wall_time, file_version=read.file_version)
            writer.write(again.SerializeToString())
        return handle.getvalue()


def test_the_bytes_are_those_tensorboard_s_own_writer_makes(trained, tmp_path):
    """The file is encoded here, not by protobuf: each event, field and CRC as TensorBoard's writer makes them, over a
    run's whole history (losses, throughputs in the thousands, memory in bytes, the ledger's times)."""
    lines = all_lines(trained("ddp", nproc=2))
    write_events(tmp_path / EVENTS, lines)
    mine = (tmp_path / EVENTS).read_bytes()
    assert mine.count(b"train/loss") == 12 and mine == tensorboards_bytes(tmp_path / EVENTS)
    # control: an event one field short of the scalar helper's (the tensor's empty shape left out, which a reader
    # takes for the same scalar) is told apart
    short = Event(wall_time=1.0, step=1, summary=scalar_pb("train/loss", 2.0))
    short.summary.value[0].tensor.ClearField("tensor_shape")
    with open(tmp_path / "short", "wb") as handle:
        RecordWriter(handle).write(short.SerializeToString())
    assert tensorboards_bytes(tmp_path / "short") != (tmp_path / "short").read_bytes()


def test_the_same_history_writes_the_same_bytes_and_a_longer_one_extends_them(trained, tmp_path):
    """Each checkpoint rewrites the file from the history so far: the earlier file is a prefix of the later one, so
    a rewrite changes no point already written, and a TensorBoard reading the run meanwhile (its multiplexer, which
    reads on from where it stopped) gets the new points."""
    lines = all_lines(trained("ddp", nproc=2))
    halfway = next(i for i, line in enumerate(lines) if line["kind"] == "eval")  # the first checkpoint's history
    write_events(tmp_path / "early", lines[:halfway + 1])
    write_events(tmp_path / "whole", lines)
    write_events(tmp_path / "again", lines)
    early, whole = (tmp_path / "early").read_bytes(), (tmp_path / "whole").read_bytes()
    assert (tmp_path / "again").read_bytes() == whole and whole.startswith(early) and len(whole) > len(early)
    # control: a history that differs in its first step does not extend the other's file
    write_events(tmp_path / "other", [dict(lines[0], loss=lines[0]["loss"] * 2), *lines[1:]])
    assert not (tmp_path / "other").read_bytes().startswith(early)
    # a TensorBoard open while the run trains
    write_events(tmp_path / "runs" / "live" / EVENTS, lines[:halfway + 1])
    watching = EventMultiplexer(tensor_size_guidance={"scalars": 0})
    watching.AddRunsFromDirectory(str(tmp_path / "runs"))
    watching.Reload()
    assert len(watching.Tensors("live", "train/loss")) == 6
    write_events(tmp_path / "runs" / "live" / EVENTS, lines)
    watching.Reload()
    assert len(watching.Tensors("live", "train/loss")) == 12


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_run_killed_after_a_checkpoint_and_resumed_has_its_whole_curve(shards, params_file, tmp_path):
    out = tmp_path / "run"
    kill_forked_ranks_after_checkpoint(shards, params_file, out, "ddp", nproc=2, step=6)
    killed = read_curves(out)
    assert max(step for step, _ in killed["train/loss"]) < 6 and "ledger/compute_s" not in killed  # the checkpoint's
    gpt2dist(*train_args(shards, params_file, out, "ddp", nproc=2))  # the same command resumes
    assert json.loads((out / "run.json").read_text())["resumed_from_step"] == 6
    lines = all_lines(out)
    assert [line["step"] for line in read_metrics(out)] == list(range(12))
    assert read_curves(out) == curves_of_metrics(lines)
    assert read_curves(out)["train/loss"][:6] == killed["train/loss"]  # the points before the kill, as they were


@pytest.mark.slow  # a launch of `gpt2dist train`
@pytest.mark.timeout(300)
def test_a_run_resumed_past_its_traced_steps_keeps_no_trace_and_says_so(trained, shards, params_file, tmp_path):
    """As a workflow tool leaves a run whose launcher died after its last checkpoint: its declared outputs deleted
    (kept/ with the traces, the record, the metrics), checkpoint.pt kept. The same command trains nothing, keeps no
    trace and names none; its metrics and curves come back whole from the checkpoint."""
    out = tmp_path / "run"
    shutil.copytree(trained("single"), out)
    before = json.loads((out / "run.json").read_text())
    assert before["trace"]["files"] == ["kept/trace-rank0.json.gz"]  # control: the run as trained kept one
    for name in ("run.json", "metrics.jsonl", EVENTS):
        (out / name).unlink()
    shutil.rmtree(out / "kept")
    gpt2dist(*train_args(shards, params_file, out, "single"))
    record = json.loads((out / "run.json").read_text())
    assert record["status"] == "completed" and record["resumed_from_step"] == 12 and record["trace"] is None
    assert (out / "kept").is_dir() and not any((out / "kept").iterdir())  # declared, and empty
    assert record["ledger"] == before["ledger"]  # the ledger of the steps traced before, from the checkpoint
    assert read_curves(out) == curves_of_metrics(all_lines(out)) and len(read_metrics(out)) == 12
