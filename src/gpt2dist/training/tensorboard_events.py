"""A run's curves for TensorBoard: its metrics.jsonl lines as scalars in one event file in the run directory
(pipeline.layout.EVENTS), so that `tensorboard --logdir results/runs` draws every run, one per directory, under the
same tags (the strategies overlay): `train/<key>` and `eval/val_loss` for the keys of metrics.jsonl's lines (`step`
the same), and `ledger/<part>` for each traced step's time ledger.

Rank 0 writes the file whole from the run's metrics history at each checkpoint and at the end, replaced atomically
as every file of a run is: a resumed run's file holds its whole curve (the history travels in the checkpoint), a
killed run's is its last checkpoint's, never half an event. TensorBoard's own protobuf messages, summary helper and
record framing write it, so its readers read it; each event's wall time is that of the step it belongs to, so the
same history always gives the same bytes and a longer one extends them: a TensorBoard reading the file as the run
trains reads on from where it stopped."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from tensorboard.compat.proto.event_pb2 import Event
from tensorboard.plugins.scalar.summary_v2 import scalar_pb
from tensorboard.summary.writer.record_writer import RecordWriter

from gpt2dist.io import atomic_open
from gpt2dist.training.ledger import PARTS

# The keys of metrics.jsonl's lines drawn, by the kind of line; a tag is "<kind>/<key>"
SCALARS = {"train": ("loss", "grad_norm", "lr", "tokens_per_s", "step_time_s", "peak_mem_bytes"),
           "eval": ("val_loss",)}
FILE_VERSION = "brain.Event:2"  # what TensorBoard's writers put first


def events(history: list[dict]) -> Iterator[Event]:
    """The event file's events, in the order of `history` (metrics.jsonl's lines): a scalar per key of SCALARS at
    the line's step, each traced step's ledger parts at that step."""
    train = [line for line in history if line["kind"] == "train"]
    if not train:
        return
    ended = {line["step"]: line["end_unix_s"] for line in train}
    yield Event(wall_time=train[0]["end_unix_s"] - train[0]["step_time_s"], file_version=FILE_VERSION)
    wall_time = train[0]["end_unix_s"]
    for line in history:
        kind = line["kind"]
        if kind == "train":  # eval and ledger lines carry no time of their own: the step before them ended then
            wall_time = line["end_unix_s"]
        for key in SCALARS.get(kind, ()):
            yield Event(wall_time=wall_time, step=line["step"], summary=scalar_pb(f"{kind}/{key}", line[key]))
        if kind == "ledger":  # per_step is in the order the traced steps ran, the last of them the latest traced
            traced = [entry["step"] for entry in train if entry.get("traced")][-len(line["per_step"]):]
            for step, parts in zip(traced, line["per_step"]):
                for part in PARTS:
                    yield Event(wall_time=ended[step], step=step, summary=scalar_pb(f"ledger/{part}", parts[part]))


def write_events(path: Path, history: list[dict]) -> None:
    """Write the event file of `history` at `path`, replacing what was there at once."""
    with atomic_open(path, "wb") as handle:
        writer = RecordWriter(handle)  # TFRecord framing: length, payload, masked CRC32Cs
        for event in events(history):
            writer.write(event.SerializeToString())
