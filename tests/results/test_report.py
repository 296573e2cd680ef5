"""The report beside other stored studies of its preset: each claim's verdicts there, and a verdict they do not
share marked unstable (a claim at the edge of the noise flips between runs of one study)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from conftest import REPO, gpt2dist

REFERENCE = REPO / "docs" / "reference" / "cpu-study"
CLAIM = "Without Apex, DDP is the fastest strategy on one node."


def stored(where: Path, name: str, summary: dict) -> None:
    (where / name).mkdir(parents=True)
    (where / name / "summary.json").write_text(json.dumps(summary))


def claim_row(results: Path) -> list[str]:
    """The claim's cells in findings.md's table."""
    row = next(line for line in (results / "findings.md").read_text().splitlines() if CLAIM in line)
    return [cell.strip() for cell in row.strip().strip("|").split("|")]


def test_a_claim_judged_otherwise_in_another_stored_study_is_marked_unstable(tmp_path):
    own = tmp_path / "results"
    own.mkdir()
    shutil.copy(REFERENCE / "summary.json", own / "summary.json")
    summary = json.loads((own / "summary.json").read_text())
    mine = next(f for f in summary["findings"] if f["text"] == CLAIM)
    assert mine["verdict"] == "supported"
    flipped = {**summary, "findings": [{**f, "verdict": "not distinguishable from noise"} if f["text"] == CLAIM else f
                                       for f in summary["findings"]]}
    stored(tmp_path / "stored", "again", flipped)
    stored(tmp_path / "stored", "other-preset", {**flipped, "preset": "two-node-cpu"})  # not this preset: skipped
    gpt2dist("report", "--results", own, "--against", tmp_path / "stored")
    row = claim_row(own)
    assert row[1:2] == ["supported, but unstable"] and row[-1] == "not distinguishable from noise in 1 of 1", row
    assert "in the 1 other stored study of this preset" in (own / "findings.md").read_text()
    assert "supported, but unstable" in (own / "summary.md").read_text()
    # control: the same verdict there is no instability, and untestable claims stay as they were
    shutil.rmtree(tmp_path / "stored" / "again")
    stored(tmp_path / "stored", "again", summary)
    gpt2dist("report", "--results", own, "--against", tmp_path / "stored")
    assert ", but unstable" not in (own / "findings.md").read_text()
    assert claim_row(own)[1:2] == ["supported"] and claim_row(own)[-1] == "supported in 1 of 1"
    # and without other studies, no column at all (the reference's own findings.md, rebuilt from its bundle): where
    # the default, docs/reference, is not (a copy of the workflow without it), a warning and the report goes on
    done = gpt2dist("report", "--results", own, cwd=tmp_path)
    assert "warning: docs/reference: no such directory, so no stored study" in " ".join(done.stderr.split())
    assert "other stored" not in (own / "findings.md").read_text() and len(claim_row(own)) == 3
    # looked for and not found: said in findings.md
    empty = tmp_path / "empty"
    empty.mkdir()
    gpt2dist("report", "--results", own, "--against", empty)
    assert "No other stored study of preset `cpu` was found to set these verdicts beside" in \
        (own / "findings.md").read_text()
    assert len(claim_row(own)) == 3


def test_a_stored_studies_path_that_does_not_exist_is_one_error_line_and_no_report(tmp_path):
    """`--against` a mistyped path once warned and ended in an ok: line, exit 0, as a finished comparison does;
    named on the command line it is refused. The control: the default, where it does not exist, stays a warning
    (the test above)."""
    own = tmp_path / "results"
    own.mkdir()
    shutil.copy(REFERENCE / "summary.json", own / "summary.json")
    refused = gpt2dist("report", "--results", own, "--against", tmp_path / "missing", check=False)
    lines = refused.stderr.strip().splitlines()
    assert refused.returncode == 2 and len(lines) == 1, refused.stderr
    assert lines[0].startswith(f"error: --against {tmp_path / 'missing'}: no such directory") and not refused.stdout
    assert not (own / "findings.md").exists() and not (own / "summary.md").exists()


def test_a_file_given_as_the_studies_to_compare_with_is_one_error_line(tmp_path):
    """A params file where a results directory belongs once wrote a report and said ok; the control: its
    directory is read (it holds no study of this preset, which findings.md says)."""
    own = tmp_path / "results"
    own.mkdir()
    shutil.copy(REFERENCE / "summary.json", own / "summary.json")
    refused = gpt2dist("report", "--results", own, "--against", REPO / "params.yaml", check=False)
    assert refused.returncode == 2 and refused.stderr.startswith(f"error: --against {REPO / 'params.yaml'} is a file")
    assert refused.stderr.count("\n") == 1 and not (own / "findings.md").exists()
    elsewhere = tmp_path / "elsewhere"  # not the repository, whose results/ the README's study may have filled
    elsewhere.mkdir()
    shutil.copy(REPO / "params.yaml", elsewhere / "params.yaml")
    gpt2dist("report", "--results", own, "--against", elsewhere)
    assert "No other stored study of preset `cpu` was found" in (own / "findings.md").read_text()


def test_findings_say_why_their_intervals_are_narrower_than_the_answers(reference_study):
    """tp/ddp read 0.37 (0.28 to 0.47) in summary.md and 0.37 (0.34 to 0.40) in findings.md with no word on why:
    the answer's intervals are widened for a placement's comparisons, a claim's are not, and findings.md says so."""
    findings = (reference_study("cpu-study") / "findings.md").read_text()
    assert "Each interval here is 95% for its own comparison; the answer in summary.md widens its intervals" in findings
    summary = (reference_study("cpu-study") / "summary.md").read_text()
    assert "(Bonferroni: " in summary  # what the answer's own note calls the widening


def test_mfu_says_which_peak_it_is_against_where_a_row_has_one():
    """The H200's study printed single fp32 at 68.9% MFU beside bf16's 28%: against fp32's own peak, which the
    table did not say. The control: a CPU study, with no MFU column, says nothing of it."""
    from gpt2dist.results.report import summary_markdown

    said = "MFU is against the peak of the arithmetic each row ran"
    gpu = json.loads((REPO / "docs" / "reference" / "h200-1gpu" / "summary.json").read_text())
    assert said in " ".join(summary_markdown(gpu).split())
    cpu = json.loads((REFERENCE / "summary.json").read_text())
    assert said not in " ".join(summary_markdown(cpu).split())
