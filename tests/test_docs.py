"""The front door and the manual: the README is read in two minutes and every link in it resolves, the numbers it
quotes are the stored study's own lines, the manual's strategy table is the registry's, and the manual builds with
`mkdocs build --strict` (a broken link or a page missing from the site fails it)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, gpt2dist

README = REPO / "README.md"
MAX_README_LINES = 90
DEVELOPMENT = REPO / "docs" / "development.md"
MAX_DEVELOPMENT_LINES = 199  # about developing; measurements go to docs/measurements.md
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def relative_links(text: str) -> list[str]:
    return [target for target in LINK.findall(text) if "://" not in target]


def unquoted_lines(readme: str, source: str) -> list[str]:
    """The README's quoted lines (`> ...`) that are not a line of `source`."""
    lines = set(source.splitlines())
    quoted = [line[2:] for line in readme.splitlines() if line.startswith("> ")]
    assert quoted, "the README quotes no line of the reference study"
    return [line for line in quoted if line not in lines]


def block_after(text: str, marker: str) -> str:
    """The lines after the comment line that starts with `marker`, up to the next blank line."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"<!-- {marker}")) + 1
    end = next((i for i in range(start, len(lines)) if not lines[i].strip()), len(lines))
    return "\n".join(lines[start:end])


def test_the_readme_is_short_and_its_links_resolve():
    text = README.read_text()
    lines = len(text.splitlines())
    assert lines <= MAX_README_LINES, f"README.md has {lines} lines; move some to docs/"
    lines = len(DEVELOPMENT.read_text().splitlines())
    assert lines <= MAX_DEVELOPMENT_LINES, f"docs/development.md has {lines} lines; measurements go to docs/measurements.md"
    missing = [target for target in relative_links(text) if not (REPO / target).exists()]
    assert not missing, f"README.md links to what does not exist: {missing}"
    # the control: the parser sees a page, an image and leaves out a web address
    assert relative_links("[a](docs/no.md) ![b](x/y.png) [c](https://example.org/z)") == ["docs/no.md", "x/y.png"]


MAX_HOW_LONG_ROWS, MAX_CELL_CHARS = 4, 100
CPU = re.compile(r"\b(EPYC|Xeon|Ryzen|Core i\d|Neoverse|Graviton)\b")
COMMIT = re.compile(r"\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b")


def how_long_faults(readme: str) -> list[str]:
    """What keeps the README's "How long" from being a newcomer's answer: more rows than commands a newcomer runs,
    a cell that tells a story or names a commit (the history goes to docs/measurements.md), a machine column
    without its CPU."""
    rows = [[cell.strip() for cell in line.strip("|").split("|")]
            for line in block_after(readme, "how-long").splitlines()]
    header, body = rows[0], rows[2:]
    faults = [f"{len(body)} rows, at most {MAX_HOW_LONG_ROWS}"] if len(body) > MAX_HOW_LONG_ROWS else []
    faults += [f"a cell of {len(cell)} characters: {cell[:40]}..." for row in rows for cell in row
               if len(cell) > MAX_CELL_CHARS]
    faults += [f"a cell names commit {COMMIT.search(cell).group()}" for row in rows for cell in row
               if COMMIT.search(cell)]
    faults += [f"the column {machine!r} names no CPU" for machine in header[1:] if not CPU.search(machine)]
    return faults


def test_how_long_is_one_short_row_per_command_and_names_each_cpu():
    readme = README.read_text()
    assert how_long_faults(readme) == []
    # the controls: a row grown into a notebook entry, one with a commit, a fifth row, a machine column without
    # its CPU
    table = block_after(readme, "how-long")
    last = table.splitlines()[-1]
    grown = readme.replace(last, last[:-1] + "; " + "an earlier clone took longer " * 4 + "|")
    assert any(fault.startswith("a cell of") for fault in how_long_faults(grown))
    dated = readme.replace(last, last[:-1] + " (2f0cb3f) |")
    assert how_long_faults(dated) == ["a cell names commit 2f0cb3f"]
    longer = readme.replace(table, table + "\n" + "\n".join([last] * MAX_HOW_LONG_ROWS))
    assert any(fault.endswith(f"at most {MAX_HOW_LONG_ROWS}") for fault in how_long_faults(longer))
    header = table.splitlines()[0]
    unnamed = readme.replace(header, header.replace("AMD EPYC", "machine"))
    assert [fault for fault in how_long_faults(unnamed) if "names no CPU" in fault]


def test_the_quoted_answer_is_the_reference_studys_own():
    """Each quoted line is a line of the stored summary, so a rebuilt reference cannot leave the README behind. The
    control: one digit changed in a quoted line is caught."""
    summary = (REPO / "docs" / "reference" / "cpu-study" / "summary.md").read_text()
    readme = README.read_text()
    assert unquoted_lines(readme, summary) == []
    quoted = next(line for line in readme.splitlines() if line.startswith("> **"))
    altered = re.sub(r"\d", lambda digit: str((int(digit.group()) + 1) % 10), quoted, count=1)
    assert unquoted_lines(altered, summary) == [altered[2:]]


def test_the_manuals_strategy_table_is_the_registrys():
    generated = gpt2dist("strategies", "--format", "markdown").stdout.strip()
    page = (REPO / "docs" / "strategies.md").read_text()
    shown = page[page.index("<!-- gpt2dist strategies --format markdown"):].split("\n", 1)[1]
    assert shown.startswith(generated + "\n\n")
    named, in_splits = generated.split("\n\n")
    assert named.count("\n| `") == len(named.splitlines()) - 2  # a row per strategy under the header


def mkdocs_build(config: Path, site: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", config,
                           "--site-dir", site], capture_output=True, text=True, timeout=300)


@pytest.mark.timeout(600)
def test_the_manual_builds_strictly_and_a_broken_link_fails_it(tmp_path):
    built = mkdocs_build(REPO / "mkdocs.yml", tmp_path / "site")
    assert built.returncode == 0, built.stderr[-3000:]
    for page in ("", "pipeline", "results", "strategies", "reference/cpu-study/summary",
                 "reference/h200-first-gpu-runs"):
        assert (tmp_path / "site" / page / "index.html").exists(), page
    # the control: the same manual with one link to a page that does not exist
    copy = tmp_path / "copy"
    shutil.copytree(REPO / "docs", copy / "docs")
    shutil.copy(REPO / "mkdocs.yml", copy / "mkdocs.yml")
    with open(copy / "docs" / "index.md", "a") as page:
        page.write("\nSee [the missing page](no-such-page.md).\n")
    broken = mkdocs_build(copy / "mkdocs.yml", tmp_path / "broken-site")
    assert broken.returncode != 0 and "no-such-page.md" in broken.stderr, broken.stderr[-3000:]


TWO_NODE, CPU_STUDY = "docs/reference/two-node-cpu", "docs/reference/cpu-study"
# (page, what it says, stored file, where that file says it): the named groups must agree
QUOTED_NUMBERS = [
    ("docs/reference/projection.md", r"step times within (?P<error>\d+)%", f"{TWO_NODE}/summary.md",
     r"Worst error of the model on these links: (?P<error>\d+)%"),
    ("docs/gpus-and-clusters.md", r"every step time on the links within (?P<error>\d+)%", f"{TWO_NODE}/summary.md",
     r"Worst error of the model on these links: (?P<error>\d+)%"),
    ("docs/gpus-and-clusters.md",
     r"ddp keeps (?P<ddp>[\d.]+) of its one-machine throughput, horovod (?P<horovod>[\d.]+) "
     r"and fsdp (?P<fsdp>[\d.]+) ",
     f"{TWO_NODE}/findings.md",
     r"horovod fp32 (?P<horovod>[\d.]+); ddp fp32 (?P<ddp>[\d.]+); fsdp fp32 (?P<fsdp>[\d.]+);"),
    ("docs/gpus-and-clusters.md",
     r"against ddp's is (?P<ddp>[^,]+\)), not distinguishable from noise, and against fsdp's (?P<fsdp>[^,]+\)),",
     f"{TWO_NODE}/findings.md", r"horovod fp32/ddp fp32 = (?P<ddp>[^;]+); horovod fp32/fsdp fp32 = (?P<fsdp>[\d.]+ \([\d.]+ to [\d.]+\))"),
    ("docs/planning.md", r"within 20% for every strategy but (?P<beyond>\w+)", f"{CPU_STUDY}/summary.md",
     r"Beyond 20% here: (?P<beyond>\w+)\."),
]


def quoted_number_mismatches(page_text: str, said: str, source_text: str, source: str) -> dict | None:
    """None when the page's numbers are the stored file's; else both sides. Text is compared with its line
    breaks and repeated spaces folded, as prose wraps anywhere."""
    fold = " ".join
    on_page, in_source = re.search(said, fold(page_text.split())), re.search(source, fold(source_text.split()))
    assert on_page and in_source, (said if not on_page else source)
    return None if on_page.groupdict() == in_source.groupdict() else {"page": on_page.groupdict(),
                                                                      "stored": in_source.groupdict()}


@pytest.mark.parametrize("page, said, stored, source", QUOTED_NUMBERS, ids=lambda v: v if "/" in v else None)
def test_numbers_the_docs_quote_are_the_stored_studys(page, said, stored, source):
    page_text, stored_text = (REPO / page).read_text(), (REPO / stored).read_text()
    assert quoted_number_mismatches(page_text, said, stored_text, source) is None
    # the control: the page with the first character of its first quoted value changed no longer agrees
    folded = " ".join(page_text.split())
    start = re.search(said, folded).start(1)
    first = folded[start]
    other = str((int(first) + 1) % 10) if first.isdigit() else ("a" if first != "a" else "b")
    assert quoted_number_mismatches(folded[:start] + other + folded[start + 1:], said, stored_text, source) is not None


NUMBER_WORDS = {word: n for n, word in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen".split())}
# a whole list's count ("the nine strategies", "all 12 figures"), not a few of it ("compares two strategies")
COUNTED = re.compile(rf"\b(?:the|all|its|our) ({'|'.join(NUMBER_WORDS)}|\d+) (strategies|presets|figures|claims)\b",
                     re.IGNORECASE)


def stated_counts(text: str) -> list[tuple[int, str]]:
    """Every count the prose states of a whole fixed list of the code's ("the nine strategies", "all 12 figures")."""
    return [(int(n) if n.isdigit() else NUMBER_WORDS[n.lower()], what.lower()) for n, what in COUNTED.findall(text)]


def test_every_count_the_docs_state_is_the_codes():
    """docs/index.md once said "the nine strategies" when there were twelve: a count of strategies, presets,
    figures or claims in the README or the manual is the registry's own. The control: that sentence is caught."""
    import yaml

    from gpt2dist.config.strategies import STRATEGIES
    from gpt2dist.results.findings import CLAIMS
    from gpt2dist.results.plots import FIGURES

    presets = yaml.safe_load((REPO / "params.yaml").read_text())["presets"]
    truth = {"strategies": len(STRATEGIES), "presets": len(presets), "figures": len(FIGURES), "claims": len(CLAIMS)}
    wrong = [(page.relative_to(REPO), n, what) for page in [README, *sorted((REPO / "docs").glob("*.md"))]
             for n, what in stated_counts(page.read_text()) if n != truth[what]]
    assert wrong == [], f"counts that are not the code's {truth}: {wrong}"
    assert stated_counts("it runs the nine strategies") == [(9, "strategies")] != [(truth["strategies"], "strategies")]
    assert stated_counts("it compares two strategies") == []  # a few of them, no count of the list
