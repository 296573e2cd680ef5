"""`snakemake --report` opened as a reader opens it: in Debian's Chromium, headless and offline (Playwright drives
it). The report must render without a console error or a request leaving the file, and each figure must show
as the image plot drew (1200 pixels wide), one click on its eye button away.

Needs Debian's chromium and the playwright package (the test extra); .ci/run installs both and sets
GPT2DIST_REQUIRE_BROWSER=1, so there a missing piece fails instead of skipping."""

from __future__ import annotations

import base64
import re
import shutil
from pathlib import Path

import pytest

from gpt2dist.pipeline.layout import FIGURES
from gpt2dist.results.plots import DPI, WIDTH

from conftest import copy_of_study, require
from reduced_study import run

pytestmark = pytest.mark.slow
# Chromium as root in a container, with nothing that calls out: this machine has no network beyond registries
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"]
FIGURE_PIXELS = int(WIDTH * DPI)


def _missing() -> str | None:
    if shutil.which("chromium") is None:
        return "Debian's chromium not installed (apt-get install chromium)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the playwright package not installed (pip install -e '.[test]')"
    return None


@pytest.fixture(scope="module")
def report(request, tmp_path_factory) -> Path:
    require("GPT2DIST_REQUIRE_BROWSER", missing=_missing())  # before the study is made: it takes a minute
    html = tmp_path_factory.mktemp("report") / "report.html"
    # in a copy: other tests read the finished study meanwhile, and Snakemake writes in the directory it works in
    study = copy_of_study(request.getfixturevalue("finished_study"), tmp_path_factory.mktemp("study") / "study")
    run(["snakemake", "--report", str(html)], study)
    return html


def open_in_chromium(html: Path, screenshot: Path | None = None) -> dict:
    """What a reader sees: console errors, requests that left the file, and each figure's shown size."""
    from playwright.sync_api import sync_playwright

    seen: dict = {"errors": [], "requests": [], "figures": {}}
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=shutil.which("chromium"), args=FLAGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.on("console", lambda message: message.type == "error" and seen["errors"].append(message.text))
            page.on("pageerror", lambda error: seen["errors"].append(str(error)))
            page.on("request", lambda request: request.url.startswith(("http:", "https:"))
                    and seen["requests"].append(request.url))
            page.goto(html.as_uri())
            page.wait_for_load_state("networkidle")
            if screenshot:
                page.screenshot(path=str(screenshot))
            page.get_by_text("Figures", exact=True).click()
            for name in FIGURES:
                row = page.get_by_text(f"results/figures/{name}.png", exact=True).locator("xpath=ancestor::tr[1]")
                row.locator("a[iconname=eye]").click()
                shown = page.locator(f"img[src*='filename={name}.png']")
                shown.wait_for(timeout=10_000)
                seen["figures"][name] = shown.evaluate("image => [image.naturalWidth, image.naturalHeight]")
        finally:
            browser.close()
    return seen


@pytest.mark.timeout(600)
def test_the_report_renders_offline_and_shows_every_figure(report, tmp_path):
    first_page = tmp_path / "first-page.png"
    seen = open_in_chromium(report, first_page)
    assert seen["errors"] == [] and seen["requests"] == [], seen
    assert set(seen["figures"]) == set(FIGURES)
    assert all(width == FIGURE_PIXELS and height > 300 for width, height in seen["figures"].values()), seen["figures"]
    assert first_page.stat().st_size > 20_000  # a page was drawn, not a blank one


@pytest.mark.timeout(600)
def test_a_figure_that_cannot_be_decoded_is_caught(report, tmp_path):
    """The control: the same report with the throughput figure's PNG bytes broken shows it as nothing."""
    html = report.read_text()
    pattern = re.compile(r"(data:image/png;charset=utf8;filename=throughput\.png;base64,)([A-Za-z0-9+/=]+)")
    assert pattern.search(html), "the report embeds its figures as data URIs"
    broken = tmp_path / "report.html"
    broken.write_text(pattern.sub(lambda m: m[1] + base64.b64encode(b"not a png").decode(), html, count=1))
    seen = open_in_chromium(broken)
    assert seen["figures"]["throughput"] == [0, 0]
    assert all(width == FIGURE_PIXELS for name, (width, _) in seen["figures"].items() if name != "throughput")
