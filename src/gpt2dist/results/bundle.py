"""Study bundles: a finished study's run records, shard description and parameters, and the
traces collect keeps of each configuration, in one archive with a sha256 manifest, so anyone can
verify it and rebuild every table, figure and finding without retraining (`gpt2dist bundle`, `gpt2dist figures --from`).
The final checkpoints the runs kept (study.keep_checkpoints) travel only when asked for (`--checkpoints`): megabytes
each on CPUs, gigabytes on GPUs, and nothing a rebuild reads.

The archive is deterministic (sorted members, zeroed times and owners, gzip without a
timestamp): bundling the same runs twice gives the same bytes, so a bundle kept in git changes
only when its data does. MANIFEST.sha256 is in `sha256sum` format, so an unpacked bundle can
also be checked with `sha256sum -c MANIFEST.sha256`.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import re
import shutil
import tarfile
import tempfile
import zlib
from importlib.metadata import version
from pathlib import Path, PurePosixPath

import yaml

from gpt2dist.config.presets import load_params, upgraded
from gpt2dist.data.shards import read_meta, sha256_file
from gpt2dist.errors import UsageError
from gpt2dist.io import atomic_open
from gpt2dist.pipeline.layout import TUNE_ANSWER, TUNE_CALIBRATION, TUNE_MEASURED, TUNE_PLAN
from gpt2dist.pipeline.study import plan_study, Study, with_added_runs

FORMAT = 1
MANIFEST = "MANIFEST.sha256"
DESCRIPTION = "bundle.json"
RUN_FILES = ("run.json", "metrics.jsonl")
# Everything a bundle may hold; anything else is refused before a byte is written out.
MEMBER = re.compile(r"(bundle\.json|params\.yaml|data/meta\.json|rounds/added-[0-9]+\.json|tune\.json"
                    r"|runs/[A-Za-z0-9._-]+/(run\.json|metrics\.jsonl|(kept/)?trace-rank[0-9]+\.json\.gz"
                    r"|kept/checkpoint\.pt))")  # traces in the run directory itself: runs from before kept/
# What a study's results directory holds beside its tables that a rebuild needs: what its added rounds decided, and a
# tune's plan (gpt2dist tune: its candidates, their predictions, what it ruled out)
DECISIONS = "rounds/added-*.json"


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def gather(study: Study, runs_dir: Path, data_dir: Path, params: Path, results: Path | None = None, *,
           checkpoints: bool = False) -> tuple[dict[str, bytes | Path], dict]:
    """The bundle's files by archive path (their bytes, or a kept checkpoint's path), and its description (what is
    in it, what is not). `study` with the repeats its added rounds decided (read from `results`, whose decisions and
    tune plan it packs too); with `checkpoints`, the final checkpoints the runs kept too."""
    read_meta(data_dir)  # a missing or foreign shard description is refused here, not at rebuild
    from gpt2dist.results.exports import kept_checkpoint
    from gpt2dist.results.per_run import code_of  # once the cheap checks passed: no scipy
    from gpt2dist.results.run_table import read_run
    from gpt2dist.results.traces import kept_traces
    from gpt2dist.system.environment import capture  # nor torch for a refusal

    files = {"params.yaml": params.read_bytes(), "data/meta.json": (data_dir / "meta.json").read_bytes()}
    if results is not None:
        decided = [*sorted(Path(results).glob(DECISIONS)), Path(results) / TUNE_PLAN]
        files |= {path.relative_to(results).as_posix(): path.read_bytes() for path in decided if path.is_file()}
    included, missing, finished, records = [], {}, [], {}
    for run in study.runs:
        try:
            record, _ = read_run(runs_dir / run.run_id)  # the same test of "completed" that collect applies
        except UsageError as exc:
            missing[run.run_id] = str(exc)
            continue
        included.append(run.run_id)
        records[run.run_id] = record
        finished.append(record.get("finished_at") or "")
        for name in RUN_FILES:
            files[f"runs/{run.run_id}/{name}"] = (runs_dir / run.run_id / name).read_bytes()
        if checkpoints and kept_checkpoint(record, runs_dir / run.run_id):  # streamed in, not read here: gigabytes
            files[f"runs/{run.run_id}/{record['kept_checkpoint']}"] = runs_dir / run.run_id / record["kept_checkpoint"]
    for kept in kept_traces(study, records, runs_dir).values():  # those collect picks, so a rebuild has them too
        for name in kept["files"]:
            files[f"runs/{kept['run_id']}/{name}"] = (runs_dir / kept["run_id"] / name).read_bytes()
    if not included:
        raise UsageError(f"no run of preset {study.preset_name} has completed in {runs_dir}; nothing to bundle")
    description = {
        "format": FORMAT,
        "preset": study.preset_name,
        "gpus": study.gpus,
        "nodes": study.nodes,
        "runs": included,
        "missing_runs": missing,
        "last_run_finished_at": max(finished),  # not the time of bundling: same runs, same bytes
        "bundled_by": f"gpt2dist {version('gpt2dist')}",
        "environment": capture(),  # of the machine that bundled; each run.json has its own
        "code": code_of(records.values()),  # the runs' commits
    }
    files[DESCRIPTION] = (json.dumps(description, indent=2, sort_keys=True) + "\n").encode()
    return files, description


def write_bundle(study: Study, runs_dir: Path, data_dir: Path, params: Path, out: Path,
                 results: Path | None = None, *, checkpoints: bool = False) -> dict:
    files, description = gather(study, Path(runs_dir), Path(data_dir), Path(params), results, checkpoints=checkpoints)
    uncommitted = description["code"]["dirty"] or (description["environment"].get("git") or {}).get("dirty")
    if uncommitted and in_reference_studies(Path(out)):
        raise UsageError(f"{out}: the runs or this tree hold uncommitted changes, and docs/reference keeps only "
                         "studies a commit regenerates; commit, re-run the study from the commit, then bundle")
    manifest = "".join(f"{sha256_file(data) if isinstance(data, Path) else sha256(data)}  {name}\n"
                       for name, data in sorted(files.items())).encode()
    with atomic_open(out, "wb") as handle:
        with gzip.GzipFile(filename="", mode="wb", fileobj=handle, mtime=0) as packed:
            with tarfile.open(fileobj=packed, mode="w", format=tarfile.PAX_FORMAT) as archive:
                for name, data in [(MANIFEST, manifest), *sorted(files.items())]:
                    info = tarfile.TarInfo(name)
                    info.mode, info.mtime = 0o644, 0
                    info.size = data.stat().st_size if isinstance(data, Path) else len(data)
                    with open(data, "rb") if isinstance(data, Path) else io.BytesIO(data) as source:
                        archive.addfile(info, source)
    return description


def in_reference_studies(path: Path) -> bool:
    """Whether `path` lies in a repository's docs/reference, where the project's own reference studies live."""
    return any(parent.name == "reference" and parent.parent.name == "docs" and (parent.parent.parent / ".git").exists()
               for parent in path.resolve().parents)


def read_bundle(path: Path) -> dict[str, bytes]:
    """Every file of the bundle, each checked against the manifest; anything else is refused."""
    damaged = "; the file is damaged or was edited: get a fresh copy, or re-run `gpt2dist bundle`"
    try:
        with tarfile.open(path, mode="r:gz") as archive:
            members = archive.getmembers()
            strange = [m.name for m in members if not m.isfile() or not (m.name == MANIFEST or MEMBER.fullmatch(m.name))]
            if strange:
                raise UsageError(f"bundle {path} holds {strange[0]!r}, which no gpt2dist bundle has{damaged}")
            files = {m.name: archive.extractfile(m).read() for m in members}
    except FileNotFoundError:
        raise UsageError(f"bundle {path} does not exist; make one with `gpt2dist bundle --out {path}`") from None
    except (tarfile.TarError, zlib.error, EOFError, gzip.BadGzipFile) as exc:
        raise UsageError(f"bundle {path} is not a readable gpt2dist bundle ({exc}){damaged}") from None
    if MANIFEST not in files:
        raise UsageError(f"bundle {path} has no {MANIFEST}{damaged}")
    listed = {}
    for line in files.pop(MANIFEST).decode(errors="replace").splitlines():
        digest, _, name = line.partition("  ")
        listed[name] = digest
    for name in sorted(listed.keys() | files.keys()):
        if name not in files:
            raise UsageError(f"bundle {path}: {name} is in the manifest but not in the archive{damaged}")
        if name not in listed:
            raise UsageError(f"bundle {path}: {name} is not in the manifest{damaged}")
        if sha256(files[name]) != listed[name]:
            raise UsageError(f"bundle {path}: {name} does not match its sha256 in the manifest{damaged}")
    if DESCRIPTION not in files or "params.yaml" not in files or "data/meta.json" not in files:
        raise UsageError(f"bundle {path} lacks {DESCRIPTION}, params.yaml or data/meta.json{damaged}")
    description = json.loads(files[DESCRIPTION])
    if description.get("format") != FORMAT:
        raise UsageError(f"bundle {path} has format {description.get('format')}; this gpt2dist reads format "
                         f"{FORMAT}: use the gpt2dist version named in its {DESCRIPTION}")
    return files


def rebuild(bundle: Path, out: Path) -> dict:
    """Verify the bundle, then collect, plot and report from its runs into `out`. Built beside `out`
    and moved into place at the end, so `out` never holds half a rebuild."""
    files = read_bundle(Path(bundle))
    description = json.loads(files[DESCRIPTION])
    out = Path(out)
    if out.exists() and any(out.iterdir()) and not (out / DESCRIPTION).is_file():
        raise UsageError(f"{out} holds files that `gpt2dist figures` did not write; choose a new or empty --out")
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{out.name}.", dir=out.parent) as work:
        source, built = Path(work) / "bundle", Path(work) / "built"
        for name, data in files.items():
            target = source / PurePosixPath(name)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        # the bundle's own params.yaml, its keys renamed to today's where an older version wrote it
        params = yaml.safe_load(files["params.yaml"])
        (source / "params.yaml").write_text(yaml.safe_dump(upgraded(params), sort_keys=False))
        planned = plan_study(load_params(source / "params.yaml"), description["preset"], description["gpus"],
                             description.get("nodes", 1))
        for name in files:  # the added rounds' decisions and a tune's plan, where collect and the tune read them
            if name.startswith("rounds/") or name == TUNE_PLAN:
                (built / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(source / name, built / name)
        study = with_added_runs(planned, built)
        from gpt2dist.results.collect import collect  # imported once the bundle is verified: a refused one
        from gpt2dist.results.plots import plot  # is told in a second, without scipy and matplotlib
        from gpt2dist.results.report import report
        from gpt2dist.results.tune import write_answer

        summary = collect(study, source / "runs", source / "data", built)
        plot(built)
        report(built)
        if TUNE_PLAN in files:  # the tune's answer beside the study's
            write_answer(built, built / TUNE_ANSWER, built / TUNE_CALIBRATION, built / TUNE_MEASURED)
        shutil.copyfile(source / DESCRIPTION, built / DESCRIPTION)  # provenance: which bundle this came from
        if out.exists():
            os.replace(out, Path(work) / "previous")
        os.replace(built, out)
    return summary
