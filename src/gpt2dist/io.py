"""Files: written atomically (a reader never sees a half-written file under its final name; a write that runs out
of disk is one line, the file as it was before), and told apart by their first bytes before they are read, so a
file of the wrong kind gets a sentence, not a parser's traceback."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from gpt2dist.errors import UsageError

# Less free than this on the file system a write failed on: it ran out of disk (torch's writer reports a full disk
# as "unexpected pos", without the OSError)
FULL_BELOW_BYTES = 64 << 10


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current


@contextlib.contextmanager
def atomic_open(path: Path | str, mode: str = "w") -> Iterator[IO[Any]]:
    """Write to a temporary file beside `path`, fsync, then rename over it; on error, delete it. A device or pipe
    (--out /dev/stdout) is written to as it is: a rename would replace it with a file (as root, /dev/null too)."""
    path = Path(path)
    if path.exists() and not path.is_file() and not path.is_dir():
        with open(path, mode) as handle:
            yield handle
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.chmod(tmp, 0o666 & ~_umask())  # mkstemp creates 0600; results are meant to be shared
    try:
        with os.fdopen(fd, mode) as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        full = isinstance(exc, Exception) and ran_out_of_disk(exc, path.parent)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if full:
            raise out_of_disk(path, f"{path.name} is as it was before this write") from exc
        raise


def out_of_disk(path: Path, kept: str) -> UsageError:
    """The one line for a write of `path` that ran out of disk; `kept`: what the failed write left as it was."""
    size = shutil.disk_usage(path.parent).total
    size_words = f"{size / 2**30:,.1f} GiB" if size >= 2**30 else f"{size / 2**20:,.2f} MiB"
    return UsageError(f"no space left on the disk holding {path.parent} ({size_words}) while writing "
                      f"{path.name}; free space there or write elsewhere. {kept} (a run's last checkpoint is intact: "
                      "once there is room, re-run the same command to resume from it)")


def cannot_be_read(path: Path, reason: BaseException | str, fix: str) -> UsageError:
    """The one line for a file that exists but cannot be read (cut short, not what its writer writes): its path,
    why on one line, and `fix`, what brings a readable one back."""
    return UsageError(f"{path} cannot be read ({' '.join(str(reason).split())}); {fix}")


def ran_out_of_disk(exc: BaseException, directory: Path) -> bool:
    """Whether a failed write ran out of disk: ENOSPC (or a quota) anywhere in its causes, or, for writers that
    do not pass the OSError on, next to no free space left where it wrote."""
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, OSError) and cause.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        cause = cause.__cause__ or cause.__context__
    try:
        stats = os.statvfs(directory)
    except OSError:
        return False
    return stats.f_bfree * stats.f_frsize < FULL_BELOW_BYTES


@contextlib.contextmanager
def atomic_directory(path: Path | str) -> Iterator[Path]:
    """Fill a temporary directory beside `path`, fsync its files, then rename it to `path` (absent or empty); on
    error, delete it: a directory under the final name is always complete. Its files are made readable as
    atomic_open's are (libraries such as safetensors create theirs 0600)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp"))
    os.chmod(work, 0o777 & ~_umask())  # mkdtemp creates 0700
    try:
        yield work
        for file in work.rglob("*"):
            if file.is_file():
                os.chmod(file, 0o666 & ~_umask())
                with open(file, "rb") as handle:
                    os.fsync(handle.fileno())
        os.replace(work, path)  # over an empty directory too; a non-empty one raises
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise


def atomic_write_text(path: Path | str, text: str) -> None:
    with atomic_open(path, "w") as handle:
        handle.write(text)


def atomic_write_json(path: Path | str, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def file_kind(path: Path | str) -> str:
    """What a file is, from its first bytes, in words for a message: 'a torch checkpoint' (torch.save's zip
    archive), 'a gzip archive', 'a params file', 'a JSON file', 'an empty file', 'a text file' or 'a binary file'."""
    path = Path(path)
    if not path.is_file():
        return "a directory" if path.is_dir() else "missing"
    with open(path, "rb") as handle:  # a checkpoint may be gigabytes: its head says enough
        head = handle.read(4096)
    if not head.strip():
        return "an empty file"
    if head.startswith(b"PK") and zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
        return "a torch checkpoint" if any(name.endswith("data.pkl") for name in names) else "a zip archive"
    if head.startswith(b"\x1f\x8b"):
        return "a gzip archive"
    try:
        text = head.decode()
    except UnicodeDecodeError:
        return "a binary file"
    stripped = text.lstrip()
    if stripped.startswith(("{", "[")):
        return "a JSON file"
    if any(line.startswith("presets:") for line in text.splitlines()):
        return "a params file"
    return "a text file"
