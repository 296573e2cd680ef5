"""A run's curves for TensorBoard: its metrics.jsonl lines as scalars in one event file in the run directory
(pipeline.layout.EVENTS), so that `tensorboard --logdir results/runs` draws every run, one per directory, under the
same tags (the strategies overlay): `train/<key>` and `eval/val_loss` for the keys of metrics.jsonl's lines (`step`
the same), and `ledger/<part>` for each traced step's time ledger.

Rank 0 writes the file whole from the run's metrics history at each checkpoint and at the end, replaced atomically
as every file of a run is: a resumed run's file holds its whole curve (the history travels in the checkpoint), a
killed run's is its last checkpoint's, never half an event. Each event's wall time is that of the step it belongs
to, so the same history always gives the same bytes and a longer one extends them: a TensorBoard reading the file as
the run trains reads on from where it stopped.

The bytes are those TensorBoard's own writer makes (its Event message holding the summary its scalar helper makes,
in TFRecord framing; tests/training/test_tensorboard_events.py compares them byte for byte), encoded here: importing
protobuf and TensorBoard's messages took 0.13 to 0.18 s of every run (a 2-core EPYC), and a training image needs no
viewer installed."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path

from gpt2dist.io import atomic_open
from gpt2dist.training.ledger import PARTS

# The keys of metrics.jsonl's lines drawn, by the kind of line; a tag is "<kind>/<key>"
SCALARS = {"train": ("loss", "grad_norm", "lr", "tokens_per_s", "step_time_s", "peak_mem_bytes"),
           "eval": ("val_loss",)}
FILE_VERSION = "brain.Event:2"  # what TensorBoard's writers put first


def events(history: list[dict]) -> Iterator[bytes]:
    """The event file's events, serialized, in the order of `history` (metrics.jsonl's lines): a scalar per key of
    SCALARS at the line's step, each traced step's ledger parts at that step."""
    train = [line for line in history if line["kind"] == "train"]
    if not train:
        return
    ended = {line["step"]: line["end_unix_s"] for line in train}
    yield event(train[0]["end_unix_s"] - train[0]["step_time_s"], 0, file_version=FILE_VERSION)
    wall_time = train[0]["end_unix_s"]
    for line in history:
        kind = line["kind"]
        if kind == "train":  # eval and ledger lines carry no time of their own: the step before them ended then
            wall_time = line["end_unix_s"]
        for key in SCALARS.get(kind, ()):
            yield event(wall_time, line["step"], scalar=(f"{kind}/{key}", line[key]))
        if kind == "ledger":  # per_step is in the order the traced steps ran, the last of them the latest traced
            traced = [entry["step"] for entry in train if entry.get("traced")][-len(line["per_step"]):]
            for step, parts in zip(traced, line["per_step"]):
                for part in PARTS:
                    yield event(ended[step], step, scalar=(f"ledger/{part}", parts[part]))


def write_events(path: Path, history: list[dict]) -> None:
    """Write the event file of `history` at `path`, replacing what was there at once."""
    with atomic_open(path, "wb") as handle:
        for serialized in events(history):
            handle.write(record(serialized))


# -- TensorBoard's messages (tensorboard/compat/proto: event.proto, summary.proto, tensor.proto), proto3's encoding:
# fields in number order, a scalar at its default left out
def event(wall_time: float, step: int, file_version: str = "", scalar: tuple[str, float] | None = None) -> bytes:
    """An Event: wall_time (1, double), step (2), file_version (3) or a summary (5) of one scalar as TensorBoard's
    scalar helper writes it: a float tensor of shape [] under the scalars plugin's metadata."""
    out = _field(1, 1, struct.pack("<d", wall_time)) if wall_time else b""
    out += _field(2, 0, _varint(step)) if step else b""
    out += _field(3, 2, file_version.encode()) if file_version else b""
    if scalar is not None:
        tag, value = scalar
        tensor = _field(1, 0, _varint(1)) + _field(2, 2, b"") + _field(5, 2, struct.pack("<f", value))  # DT_FLOAT
        metadata = _field(1, 2, _field(1, 2, b"scalars"))  # plugin_data.plugin_name
        summary_value = _field(1, 2, tag.encode()) + _field(8, 2, tensor) + _field(9, 2, metadata)
        out += _field(5, 2, _field(1, 2, summary_value))  # Summary.value[0]
    return out


def _field(number: int, wire_type: int, payload: bytes) -> bytes:
    """One field: its key, then a varint (wire type 0), 8 bytes (1) or a length and the bytes (2)."""
    key = _varint(number << 3 | wire_type)
    return key + (_varint(len(payload)) + payload if wire_type == 2 else payload)


def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1  # a negative int64 as its two's complement, as protobuf writes it
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


# -- TFRecord framing: length, its masked CRC-32C, the payload, its masked CRC-32C
def record(payload: bytes) -> bytes:
    length = struct.pack("<Q", len(payload))
    return length + struct.pack("<I", _masked_crc(length)) + payload + struct.pack("<I", _masked_crc(payload))


def _crc32c_table() -> list[int]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = crc >> 1 ^ (0x82F63B78 if crc & 1 else 0)  # Castagnoli's polynomial, reflected
        table.append(crc)
    return table


_CRC32C = _crc32c_table()


def _masked_crc(data: bytes) -> int:
    """CRC-32C of `data`, rotated and offset as TFRecord stores it (so a CRC of CRCs is not one)."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _CRC32C[(crc ^ byte) & 0xFF] ^ crc >> 8
    crc ^= 0xFFFFFFFF
    return ((crc >> 15 | crc << 17) + 0xA282EAD8) & 0xFFFFFFFF
