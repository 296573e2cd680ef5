"""gpt2dist.io: atomic writes (never a half file under the final name, never a device replaced by a file) and
files told apart by their first bytes, so a file of the wrong kind gets a sentence instead of a parser's error."""

from __future__ import annotations

import errno
import gzip
import os
import stat
import threading

import pytest
import torch

from gpt2dist.errors import UsageError
from gpt2dist.io import atomic_directory, atomic_open, atomic_write_text, file_kind, ran_out_of_disk

from conftest import REPO


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "summary.json"
    target.write_text("old")
    with pytest.raises(RuntimeError), atomic_open(target) as handle:
        handle.write("half")
        raise RuntimeError("interrupted")
    assert target.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["summary.json"]


def test_a_write_that_fills_the_disk_is_one_line_and_leaves_the_old_file(small_disk):
    """torch.save onto a full disk raised torch's 'unexpected pos' traceback: it is one line naming the disk, the
    file as it was, and no temporary left to hold the space. The control: on the same disk with room, a write's
    own error is still that error, not a full disk."""
    disk = small_disk(256 * 1024)
    target = disk / "checkpoint.pt"
    torch.save({"w": torch.zeros(16_384)}, target)  # 64 KiB of floats
    before = target.read_bytes()
    with pytest.raises(UsageError, match=rf"^no space left on the disk holding {disk} \(0.25 MiB\) while writing "
                                         r"checkpoint.pt; free space there or write elsewhere. checkpoint.pt is as it "
                                         r"was before this write"), atomic_open(target, "wb") as handle:
        torch.save({"w": torch.zeros(262_144)}, handle)  # 1 MiB: more than the disk
    assert target.read_bytes() == before and [p.name for p in disk.iterdir()] == ["checkpoint.pt"]
    with pytest.raises(RuntimeError, match="^interrupted$"), atomic_open(target, "wb") as handle:
        torch.save({"w": torch.zeros(1024)}, handle)
        raise RuntimeError("interrupted")
    assert target.read_bytes() == before
    assert ran_out_of_disk(OSError(errno.ENOSPC, "No space left on device"), disk)  # said by the OSError itself


def test_a_pipe_is_written_to_not_replaced(tmp_path):
    """As root, renaming over /dev/null replaced it with a file; a pipe stands in for a device here."""
    fifo = tmp_path / "out"
    os.mkfifo(fifo)
    received = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_text()))
    reader.start()
    atomic_write_text(fifo, "plan\n")
    reader.join(timeout=10)
    assert received == ["plan\n"] and stat.S_ISFIFO(fifo.stat().st_mode)


def test_files_are_told_apart_by_their_first_bytes(tmp_path):
    torch.save({"step": 1}, tmp_path / "checkpoint.pt")
    (tmp_path / "bundle.tar.gz").write_bytes(gzip.compress(b"x"))
    (tmp_path / "run.json").write_text('{"status": "completed"}')
    (tmp_path / "blank.json").write_text("\n\n")
    (tmp_path / "notes.txt").write_text("a note")
    (tmp_path / "train.bin").write_bytes(bytes(range(256)))
    kinds = {name: file_kind(tmp_path / name) for name in
             ("checkpoint.pt", "bundle.tar.gz", "run.json", "blank.json", "notes.txt", "train.bin", "nothing")}
    assert kinds == {"checkpoint.pt": "a torch checkpoint", "bundle.tar.gz": "a gzip archive", "run.json": "a JSON file",
                     "blank.json": "an empty file", "notes.txt": "a text file", "train.bin": "a binary file",
                     "nothing": "missing"}
    assert file_kind(REPO / "params.yaml") == "a params file" and file_kind(tmp_path) == "a directory"


def test_a_directory_appears_whole_or_not_at_all(tmp_path):
    """Filled beside its name and renamed: a failure leaves neither it nor a temporary; an empty directory of that
    name is replaced, its files readable as atomic_open's are. The control: a directory holding files is not."""
    target, umask = tmp_path / "export", os.umask(0)
    os.umask(umask)
    with pytest.raises(RuntimeError), atomic_directory(target) as work:
        (work / "config.json").write_text("{}")
        raise RuntimeError("interrupted")
    assert list(tmp_path.iterdir()) == []
    target.mkdir()
    with atomic_directory(target) as work:
        (work / "weights").write_bytes(b"1")
        os.chmod(work / "weights", 0o600)  # as safetensors creates its files
    assert (target / "weights").read_bytes() == b"1" and [p.name for p in tmp_path.iterdir()] == ["export"]
    assert stat.S_IMODE((target / "weights").stat().st_mode) == 0o666 & ~umask
    with pytest.raises(OSError), atomic_directory(target) as work:
        (work / "other").write_text("")
    assert [p.name for p in target.iterdir()] == ["weights"] and [p.name for p in tmp_path.iterdir()] == ["export"]
