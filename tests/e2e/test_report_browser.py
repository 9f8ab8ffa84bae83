"""The HTML report in a real browser: headless Chromium (Debian's, installed by
``scripts/e2e_setup.sh browser``) driven by playwright.

Two real runs, each the CLI on a bundled example at the PR tier, on the CPU: the digits example
(``dlci memorize``, ``doctor`` and ``profile`` into one folder, as a job's artifacts hold them)
and the Lightning example (``dlci memorize`` and ``doctor``). Each folder's report.html, as the
last verb wrote it, must render with every section, every image loaded (decoded to a width),
and nothing cut: no element wider than the window, at a desktop width and a narrow one.

``DLCI_REPORT_SCREENSHOTS=DIR`` keeps the full-page screenshots there (docs/images/ holds the
ones taken so, as examples of the report).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import missing
from dlci.cli import main

pytestmark = pytest.mark.e2e

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
# a comparison and a history only where a job made them (none here): no empty sections
SECTIONS = ["verdicts", "memorization", "doctor", "utilization"]
WIDTHS = (1100, 760)
# what the page says about itself, read in the browser
PROBE = """() => ({
  sections: [...document.querySelectorAll('section')].map(s => s.id),
  images: [...document.images].map(i => ({alt: i.alt, done: i.complete, width: i.naturalWidth,
                                          right: i.getBoundingClientRect().right})),
  figures: [...document.querySelectorAll('figure[id^="figure-"]')].map(f => f.id),
  widest: Math.max(...[...document.querySelectorAll('body *')]
                       .map(e => e.getBoundingClientRect().right)),
  scroll: document.documentElement.scrollWidth,
  window: window.innerWidth,
})"""


def _run(example: str, out: Path, *verbs: str) -> None:
    mp = pytest.MonkeyPatch()
    mp.chdir(EXAMPLES / example)
    mp.syspath_prepend(str(EXAMPLES / example))
    mp.setenv("CUDA_VISIBLE_DEVICES", "")
    try:
        for verb in verbs:
            quiet = ["--quiet"] if verb != "doctor" else []
            code = main([verb, "--out", str(out), "--budget", "pr", *quiet])
            assert code == 0, f"dlci {verb} on the {example} example exited {code}"
    finally:
        mp.undo()


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    chromium = os.environ.get("DLCI_CHROMIUM") or shutil.which("chromium")
    if chromium is None:
        missing("no chromium on PATH")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        missing("playwright is not installed (dl-ci[dev])")
    with sync_playwright() as driver:
        launched = driver.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        yield launched
        launched.close()


@pytest.fixture(scope="module")
def digits(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("digits")
    _run("digits", out, "memorize", "doctor", "profile")
    return out


@pytest.fixture(scope="module")
def lightning(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("lightning")
    _run("lightning", out, "memorize", "doctor")
    return out


def _look(browser: object, folder: Path, name: str) -> list[dict]:
    """The probe at each width, and a full-page screenshot at the first."""
    page = browser.new_page(viewport={"width": WIDTHS[0], "height": 900})  # type: ignore[attr-defined]
    try:
        page.goto((folder / "report.html").as_uri())
        page.wait_for_load_state("load")
        seen = []
        for width in WIDTHS:
            page.set_viewport_size({"width": width, "height": 900})
            seen.append(page.evaluate(PROBE))
        page.set_viewport_size({"width": WIDTHS[0], "height": 900})
        shot = folder / f"report-{name}.png"
        page.screenshot(path=str(shot), full_page=True)
        assert shot.read_bytes()[:4] == b"\x89PNG"
        keep = os.environ.get("DLCI_REPORT_SCREENSHOTS")
        if keep:
            shutil.copy(shot, Path(keep) / shot.name)
    finally:
        page.close()
    return seen


def _check(seen: list[dict], figures: list[str]) -> None:
    for probe in seen:
        assert probe["sections"] == SECTIONS
        assert probe["figures"] == [f"figure-{f}" for f in figures]
        assert probe["images"], "no image on the page"
        for image in probe["images"]:
            assert image["done"] and image["width"] > 0, f"not loaded: {image['alt']}"
            assert image["right"] <= probe["window"], f"cut: {image['alt']}"
        assert probe["scroll"] <= probe["window"], probe  # no sideways scrolling
        assert probe["widest"] <= probe["window"] + 1, probe


ALL_FIGURES = ["examples", "lr-range", "grad-flow", "update-ratio", "activations", "weight-norms"]


def test_the_digits_job_report_renders_every_section(browser: object, digits: Path) -> None:
    seen = _look(browser, digits, "digits")
    _check(seen, ALL_FIGURES)
    alts = [i["alt"] for i in seen[0]["images"]]
    assert alts[0] == "memorization curve" and alts[-1] == "utilization per step"


def test_the_lightning_report_renders_every_section(browser: object, lightning: Path) -> None:
    seen = _look(browser, lightning, "lightning")
    _check(seen, ALL_FIGURES)
    assert "utilization per step" not in [i["alt"] for i in seen[0]["images"]]  # not profiled


def test_control_a_report_with_a_broken_image_and_a_wide_table_is_caught(
    browser: object, digits: Path, tmp_path: Path
) -> None:
    """The checks above can fail: the digits page with one image's data not a PNG and a table
    forced wider than the window fails both."""
    page = (digits / "report.html").read_text()
    start = page.index('src="data:image/png;base64,') + len('src="data:image/png;base64,')
    page = page[:start] + "bm90IGEgcG5n" + page[page.index('"', start) :]  # "not a png"
    page = page.replace("table-layout: fixed;", "table-layout: fixed; min-width: 1400px;", 1)
    (tmp_path / "report.html").write_text(page)
    seen = _look(browser, tmp_path, "control")
    broken = [i["alt"] for i in seen[0]["images"] if not (i["done"] and i["width"] > 0)]
    assert broken == ["memorization curve"]
    assert seen[0]["scroll"] > seen[0]["window"] and seen[0]["widest"] > seen[0]["window"]
    with pytest.raises(AssertionError, match="not loaded: memorization curve"):
        _check(seen, ALL_FIGURES)
