"""Stored results: a study packed into one verified archive rebuilds the pipeline's tables exactly,
anywhere, without training; an altered bundle is refused with one line."""

from __future__ import annotations

import gzip
import io
import json
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from conftest import REPO, gpt2dist

REFERENCE_BUNDLE = REPO / "docs" / "reference" / "cpu-study.tar.gz"
TABLES = ("metrics.csv", "runs.csv", "summary.csv")

pytestmark = pytest.mark.timeout(300)


def members(bundle) -> dict[str, bytes]:
    with tarfile.open(bundle, "r:gz") as archive:
        return {m.name: archive.extractfile(m).read() for m in archive.getmembers()}


def repack(out, files: dict[str, bytes]) -> None:
    """An archive with these members, written the way an editing hand would (manifest untouched)."""
    with gzip.open(out, "wb") as packed, tarfile.open(fileobj=packed, mode="w") as archive:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))


def refused(result, *phrases: str) -> None:
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert all(phrase in lines[0] for phrase in phrases), lines[0]


@pytest.fixture(scope="module")
def study_bundle(finished_study, tmp_path_factory):
    """The reduced study that Snakemake ran, bundled (from its own directory, as a user would)."""
    out = tmp_path_factory.mktemp("bundle") / "study.tar.gz"
    gpt2dist("bundle", "--out", out, cwd=finished_study)
    return out


@pytest.mark.slow  # a whole pipeline study first (finished_study)
def test_a_bundle_rebuilds_the_pipelines_tables_exactly(finished_study, study_bundle, tmp_path):
    rebuilt = tmp_path / "rebuilt"
    gpt2dist("figures", "--from", study_bundle, "--out", rebuilt)
    for name in TABLES:
        assert (rebuilt / name).read_bytes() == (finished_study / "results" / name).read_bytes(), name
    assert {p.name for p in (rebuilt / "figures").iterdir()} == {
        p.name for p in (finished_study / "results" / "figures").iterdir()}
    assert (rebuilt / "summary.md").is_file() and (rebuilt / "findings.md").is_file()
    description = json.loads((rebuilt / "bundle.json").read_text())
    assert description["preset"] == "cpu" and len(description["runs"]) == 4 and not description["missing_runs"]


@pytest.mark.slow  # a whole pipeline study first (finished_study)
def test_the_same_runs_bundle_to_the_same_bytes(finished_study, study_bundle, tmp_path):
    again = tmp_path / "again.tar.gz"
    gpt2dist("bundle", "--out", again, cwd=finished_study)
    assert again.read_bytes() == study_bundle.read_bytes()
    files = members(again)
    assert list(files)[0] == "MANIFEST.sha256"  # first, so a reader can check as it streams
    assert sorted(files) == sorted(["MANIFEST.sha256", "bundle.json", "data/meta.json", "params.yaml",
                                    *(f"runs/{run}/{name}" for run in ("ddp-fp32-n2-r0", "ddp-fp32-n2-r1",
                                                                       "single-fp32-n1-r0", "single-fp32-n1-r1")
                                      for name in ("metrics.jsonl", "run.json")),
                                    # the traces the report links: each configuration's first repeat, every rank
                                    "runs/ddp-fp32-n2-r0/kept/trace-rank0.json.gz",
                                    "runs/ddp-fp32-n2-r0/kept/trace-rank1.json.gz",
                                    "runs/single-fp32-n1-r0/kept/trace-rank0.json.gz"])


@pytest.mark.slow  # a whole pipeline study first (finished_study)
@pytest.mark.slow  # a whole pipeline study first (finished_study)
def test_the_kept_checkpoints_travel_only_when_asked_for(finished_study, study_bundle, tmp_path):
    """`gpt2dist bundle --checkpoints` adds the final checkpoints the runs kept (each configuration's first repeat),
    byte for byte and in the manifest, and a rebuild reads the bundle as it reads one without; the control is the
    default bundle, which holds none."""
    with_checkpoints = tmp_path / "with-checkpoints.tar.gz"
    gpt2dist("bundle", "--checkpoints", "--out", with_checkpoints, cwd=finished_study)
    plain, added = members(study_bundle), members(with_checkpoints)
    kept = {f"runs/{run}/kept/checkpoint.pt" for run in ("single-fp32-n1-r0", "ddp-fp32-n2-r0")}
    assert set(added) - set(plain) == kept and not [name for name in plain if name.endswith(".pt")]
    for name in kept:
        assert added[name] == (finished_study / "results" / name).read_bytes()
    gpt2dist("figures", "--from", with_checkpoints, "--out", tmp_path / "rebuilt")
    assert (tmp_path / "rebuilt" / "summary.csv").read_bytes() == (finished_study / "results" / "summary.csv").read_bytes()


def test_a_run_that_did_not_complete_is_listed_not_packed(study_bundle, tmp_path):
    unpacked = tmp_path / "study"
    for name, data in members(study_bundle).items():
        (unpacked / name).parent.mkdir(parents=True, exist_ok=True)
        (unpacked / name).write_bytes(data)
    (unpacked / "runs" / "ddp-fp32-n2-r1" / "run.json").unlink()
    out = tmp_path / "partial.tar.gz"
    done = gpt2dist("bundle", "--out", out, "--runs", unpacked / "runs", "--data", unpacked / "data",
                    "--params", unpacked / "params.yaml")
    assert "3 runs of preset cpu, 1 missing" in done.stdout
    description = json.loads(members(out)["bundle.json"])
    assert list(description["missing_runs"]) == ["ddp-fp32-n2-r1"]
    gpt2dist("figures", "--from", out, "--out", tmp_path / "rebuilt")
    assert "ddp-fp32-n2-r1" in json.loads((tmp_path / "rebuilt" / "summary.json").read_text())["missing_runs"]
    # the traces the rebuilt report links travelled in the bundle
    assert sorted(p.name for p in (tmp_path / "rebuilt" / "traces").iterdir()) == [
        "ddp-fp32-n2.rank0.json.gz", "ddp-fp32-n2.rank1.json.gz", "single-fp32-n1.rank0.json.gz"]


def test_nothing_to_bundle_is_one_error(tmp_path):
    refused(gpt2dist("bundle", "--out", tmp_path / "x.tar.gz", "--runs", tmp_path, "--data", tmp_path, check=False),
            "meta.json is missing")
    assert not (tmp_path / "x.tar.gz").exists()


@pytest.mark.parametrize("study", ["cpu-study", pytest.param("two-node-cpu", marks=pytest.mark.slow),
                                   pytest.param("two-node-splits-cpu", marks=pytest.mark.slow)])  # the fast tier: one
def test_the_shipped_reference_bundle_reproduces_docs_reference(study, reference_study, tmp_path):
    """Every figure and table under docs/reference/<study>/ comes from the bundle beside it, by one command."""
    reference, rebuilt = REPO / "docs" / "reference" / study, reference_study(study)
    for name in ("summary.csv", "summary.md", "findings.md", "link_model.csv"):
        assert (rebuilt / name).read_bytes() == (reference / name).read_bytes(), name
    assert {p.name for p in (reference / "figures").iterdir()} <= {p.name for p in (rebuilt / "figures").iterdir()}
    if study == "two-node-cpu":  # no creation date and fixed ids in the vector figures: the same runs, the same bytes
        again = tmp_path / "again"
        gpt2dist("figures", "--from", reference.with_name(f"{study}.tar.gz"), "--out", again)
        svgs = sorted((again / "figures").glob("*.svg"))
        assert svgs and all((rebuilt / "figures" / svg.name).read_bytes() == svg.read_bytes() for svg in svgs)


def test_the_committed_dvc_views_are_the_reference_studys():
    """results/headline/ (what `dvc metrics show` reads) and results/loss_curves.csv (`dvc plots`), as git holds
    them, come from the same study as docs/reference/cpu-study; no root dvc.lock claims another one. Read from
    the commit, not the working tree: a user's study rewrites those files."""
    reference = REPO / "docs" / "reference" / "cpu-study"

    def committed(path: str) -> bytes:
        return subprocess.run(["git", "show", f"HEAD:{path}"], cwd=REPO, capture_output=True, check=True).stdout

    listed = subprocess.run(["git", "ls-tree", "--name-only", "HEAD", "results/headline/"], cwd=REPO,
                            capture_output=True, text=True, check=True).stdout.split()
    headline = sorted(Path(path).name for path in listed)
    assert headline == sorted(p.name for p in (reference / "headline").iterdir()) and headline
    for name in headline:
        assert committed(f"results/headline/{name}") == (reference / "headline" / name).read_bytes(), name
    assert committed("results/loss_curves.csv") == (reference / "loss_curves.csv").read_bytes()
    tracked = subprocess.run(["git", "ls-files", "dvc.lock"], cwd=REPO, capture_output=True, text=True).stdout
    assert not (REPO / "dvc.lock").exists() and not tracked.strip()


def test_one_altered_byte_is_refused_and_nothing_is_written(tmp_path):
    damaged = tmp_path / "damaged.tar.gz"
    data = bytearray(REFERENCE_BUNDLE.read_bytes())
    data[len(data) // 2] ^= 0x01
    damaged.write_bytes(bytes(data))
    refused(gpt2dist("figures", "--from", damaged, "--out", tmp_path / "out", check=False), str(damaged),
            "damaged or was edited")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("edit", ["changed", "added", "removed", "escaping"])
def test_an_edited_member_is_named(edit, tmp_path):
    files = members(REFERENCE_BUNDLE)
    run = next(name for name in files if name.endswith("metrics.jsonl"))
    if edit == "changed":
        files[run] = files[run].replace(b'"loss": ', b'"loss": 0', 1)
        expected = f"{run} does not match its sha256"
    elif edit == "added":
        files[run.replace("metrics.jsonl", "run.json").replace("-r0/", "-r9/")] = b"{}"
        expected = "is not in the manifest"
    elif edit == "removed":
        del files[run]
        expected = f"{run} is in the manifest but not in the archive"
    else:
        files["../outside.txt"] = b"x"
        expected = "'../outside.txt', which no gpt2dist bundle has"
    edited = tmp_path / "edited.tar.gz"
    repack(edited, files)
    refused(gpt2dist("figures", "--from", edited, "--out", tmp_path / "out", check=False), expected)
    assert not (tmp_path / "out").exists() and not (tmp_path / "outside.txt").exists()


@pytest.mark.slow  # a whole pipeline study first (finished_study)
def test_figures_replace_only_their_own_output(study_bundle, finished_study, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    refused(gpt2dist("figures", "--from", study_bundle, "--out", out, check=False), "did not write")
    assert (out / "notes.txt").read_text() == "mine"
    shutil.rmtree(out)
    gpt2dist("figures", "--from", study_bundle, "--out", out)
    gpt2dist("figures", "--from", study_bundle, "--out", out)  # a rebuild replaces the previous one
    assert (out / "summary.csv").read_bytes() == (finished_study / "results" / "summary.csv").read_bytes()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out.")]  # no work directory left behind


@pytest.mark.slow  # a rebuild of 60 runs
@pytest.mark.timeout(300)
def test_runs_from_uncommitted_changes_say_so_first_and_stay_out_of_docs_reference(tmp_path):
    """The reference bundle's runs unpacked, one of them marked as made from a dirty tree: bundling them into a
    repository's docs/reference is refused, and anywhere else the rebuilt summary's first line says it. The
    control: the same runs as committed (the reference itself, rebuilt byte for byte above) have a plain title."""
    files = members(REFERENCE_BUNDLE)
    study = tmp_path / "study"
    for name, data in files.items():
        if name.startswith(("runs/", "data/")) or name == "params.yaml":
            (study / name).parent.mkdir(parents=True, exist_ok=True)
            (study / name).write_bytes(data)
    first = sorted((study / "runs").glob("*/run.json"))[0]
    record = json.loads(first.read_text())
    first.write_text(json.dumps(record | {"git": record["git"] | {"dirty": True}}))
    repository = tmp_path / "repository"
    (repository / ".git").mkdir(parents=True)
    (repository / "docs" / "reference").mkdir(parents=True)
    bundle = ("bundle", "--runs", study / "runs", "--data", study / "data", "--params", study / "params.yaml",
              "--preset", "cpu", "--gpus", "0")
    refused(gpt2dist(*bundle, "--out", repository / "docs" / "reference" / "x.tar.gz", check=False),
            "uncommitted changes", "docs/reference keeps only studies a commit regenerates")
    assert not (repository / "docs" / "reference" / "x.tar.gz").exists()
    gpt2dist(*bundle, "--out", tmp_path / "dirty.tar.gz")
    gpt2dist("figures", "--from", tmp_path / "dirty.tar.gz", "--out", tmp_path / "dirty")
    for name in ("summary.md", "findings.md"):
        assert (tmp_path / "dirty" / name).read_text().splitlines()[0].endswith("(from uncommitted changes)"), name
    assert not any(json.loads(data)["git"]["dirty"] for name, data in files.items() if name.endswith("run.json"))
    reference = REPO / "docs" / "reference" / "cpu-study"
    assert "uncommitted" not in (reference / "summary.md").read_text().splitlines()[0]
