"""Text sources for `gpt2dist prepare`: each yields (split, document) pairs in a fixed order.

Sources with their own validation split keep it; the others get a seeded, per-document
assignment (a hash of seed and document index), so the split is reproducible and needs
no pass over the whole corpus first.
"""

from __future__ import annotations

import ast
import collections
import functools
import glob
import hashlib
import json
import sysconfig
from collections.abc import Iterator
from pathlib import Path

from gpt2dist.config.schema import DataConfig, EmbeddedSource, FilesSource, HFSource
from gpt2dist.errors import UsageError

Document = tuple[str, str]  # (split, text)
LOCAL_HINT = "point the preset's data.source at local files instead (kind: files, paths: [...])"


def is_val(seed: int, index: int, fraction: float) -> bool:
    digest = hashlib.blake2b(f"{seed}:{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") / 2**64 < fraction


def _assign(texts: Iterator[str], cfg: DataConfig) -> Iterator[Document]:
    for index, text in enumerate(texts):
        yield ("val" if is_val(cfg.seed, index, cfg.val_fraction) else "train"), text


@functools.lru_cache(maxsize=2)
def stdlib_docstrings(min_chars: int) -> tuple[str, ...]:
    """Docstrings of modules, classes and functions in the standard library, in path order.

    About 1.3 MB, so it is held in memory: prepare reads it twice (tokenizer training,
    then encoding) and parsing the library takes seconds.
    """
    return tuple(_iter_stdlib_docstrings(min_chars))


def _iter_stdlib_docstrings(min_chars: int) -> Iterator[str]:
    root = Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).parts
        if rel[0] in ("site-packages", "dist-packages") or "test" in rel or "tests" in rel:
            continue
        try:
            tree = ast.parse(path.read_bytes())
        except (SyntaxError, ValueError, UnicodeDecodeError):
            continue  # a few stdlib files are deliberately broken (lib2to3 fixtures)
        for node in _statements_breadth_first(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc and len(doc) >= min_chars:
                    yield doc


STATEMENT_HOLDERS = (ast.stmt, ast.excepthandler, ast.match_case)  # every node a def or class can sit in


def _statements_breadth_first(tree: ast.Module) -> Iterator[ast.AST]:
    """The nodes that can hold statements, in `ast.walk`'s breadth-first order (the corpus's order, so
    its bytes stay those of every stored study), without visiting expressions: a fifth of the time."""
    queue = collections.deque([tree])
    while queue:
        node = queue.popleft()
        yield node
        for field in node._fields:
            value = getattr(node, field, None)
            if isinstance(value, list):
                queue.extend(child for child in value if isinstance(child, STATEMENT_HOLDERS))


def _local_documents(source: FilesSource) -> Iterator[str]:
    paths = sorted({p for pattern in source.paths for p in glob.glob(pattern, recursive=True)})
    if not paths:
        raise UsageError(f"no files match data.source.paths {source.paths} (relative to {Path.cwd()})")
    for name in paths:
        path = Path(name)
        if path.suffix == ".txt":
            yield path.read_text(encoding="utf-8")
        elif path.suffix == ".jsonl":
            with open(path, encoding="utf-8") as handle:
                for number, line in enumerate(handle, 1):
                    if line.strip():
                        yield _field(json.loads(line), source.text_field, f"{path}:{number}")
        elif path.suffix == ".parquet":
            import pyarrow.parquet as pq

            for batch in pq.ParquetFile(path).iter_batches(columns=[source.text_field]):
                yield from batch.column(0).to_pylist()
        else:
            raise UsageError(f"{path}: unsupported file type '{path.suffix}' (use .txt, .jsonl or .parquet)")


def _field(record: dict, field: str, where: str) -> str:
    if field not in record:
        raise UsageError(f"{where} has no field '{field}' (set data.source.text_field)")
    return record[field]


def _load_hf(source: HFSource, split: str):
    import datasets

    local = Path(source.name).is_dir()
    if not local and source.revision is None:
        raise UsageError(f"hub dataset '{source.name}' needs a pinned data.source.revision (a commit id)")
    try:
        return datasets.load_dataset(source.name, source.config, split=split, revision=None if local else source.revision)
    except (ConnectionError, OSError, ValueError, FileNotFoundError, datasets.exceptions.DatasetNotFoundError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise UsageError(f"could not load dataset '{source.name}' split '{split}' ({first}); {LOCAL_HINT}") from None


def _hf_documents(source: HFSource, cfg: DataConfig) -> Iterator[Document]:
    def texts(split: str) -> Iterator[str]:
        dataset = _load_hf(source, split)
        if source.text_column not in dataset.column_names:
            raise UsageError(f"dataset '{source.name}' has no column '{source.text_column}' "
                             f"(columns: {', '.join(dataset.column_names)}); set data.source.text_column")
        for batch in dataset.iter(batch_size=1024):
            yield from batch[source.text_column]

    if source.val_split is None:
        yield from _assign(texts(source.train_split), cfg)
        return
    yield from (("train", t) for t in texts(source.train_split))
    yield from (("val", t) for t in texts(source.val_split))


def documents(cfg: DataConfig) -> Iterator[Document]:
    """(split, text) for every non-blank document of the configured source, in a fixed order."""
    source = cfg.source
    if isinstance(source, EmbeddedSource):
        stream = _assign(iter(stdlib_docstrings(source.min_chars)), cfg)
    elif isinstance(source, FilesSource):
        stream = _assign(_local_documents(source), cfg)
    else:
        stream = _hf_documents(source, cfg)
    return ((split, text) for split, text in stream if text and not text.isspace())


def describe_source(cfg: DataConfig) -> dict:
    source = cfg.source.model_dump()
    if isinstance(cfg.source, EmbeddedSource):
        source["python"] = sysconfig.get_python_version()
        source["note"] = "stand-in corpus for smoke runs, not a benchmark corpus"
    return source
