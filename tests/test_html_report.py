"""The doctor's figures and the HTML report, from real reports (tests/data/reports: the digits
example's doctor, memorize and profile, recorded here), and from hostile ones.

What a browser makes of the page is tested in real headless Chromium
(tests/e2e/test_report_browser.py); here: what is drawn, what is embedded, what is escaped.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from dlci.cli import main
from dlci.report import doctor, figures, html
from dlci.report.memorization import plot_curve, read

DATA = Path(__file__).parent / "data" / "reports"
PNG = html.PNG_MAGIC
HOSTILE = '<script>alert("x")</script><img src=x onerror=alert(1)>'


def _report(name: str) -> dict:
    return json.loads((DATA / f"{name}.json").read_text())


@pytest.fixture(scope="module")
def drawn(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, figures.Figures]:
    """A folder as dlci memorize, doctor and profile leave it (figures drawn from the report),
    drawn once for the module, and what doctor_figures said it drew."""
    out = tmp_path_factory.mktemp("drawn")
    for name in ("doctor", "memorization", "utilization"):
        shutil.copy(DATA / f"{name}.json", out / f"{name}.json")
    plot_curve(read(_report("memorization")), out / "memorization-curve.png")
    return out, figures.doctor_figures(doctor.read(_report("doctor")), out)


@pytest.fixture
def folder(drawn: tuple[Path, figures.Figures], tmp_path: Path) -> Path:
    """The drawn folder, a copy of its own for each test."""
    return Path(shutil.copytree(drawn[0], tmp_path / "reports"))


def test_every_instrument_is_drawn_from_a_real_report(drawn: tuple[Path, figures.Figures]) -> None:
    folder, said = drawn
    assert [f.id for f in said.figures] == list(figures.DRAWERS)
    assert said.skipped == {}
    for entry in said.figures:
        assert (folder / entry.file).read_bytes().startswith(PNG)
        assert entry.healthy.startswith("healthy: ")


def test_a_skipped_check_or_malformed_details_draw_nothing_and_say_why(tmp_path: Path) -> None:
    report = _report("doctor")
    hostile = {
        "lr-range": {"lrs": ["a", None], "smoothed_loss": [1.0]},
        "grad-flow": {"grad_norms": {"w": "nan", "v": [1]}},
        "update-ratio": {"ratio_by_step": {"w": "x"}, "median_ratio": 3},
        "activations": {"head": {"dead": "inf"}, "x": 4},
        "weight-norms": {"norm_by_step": "not a mapping"},
    }
    for check in report["checks"]:
        if check["id"] in hostile:
            check["details"] = hostile[check["id"]]
    drawn = figures.doctor_figures(doctor.read(report), tmp_path)
    assert drawn.figures == []
    assert set(drawn.skipped) == set(figures.DRAWERS)
    assert not (tmp_path / "figures").exists()
    report["checks"] = [dict(c, status="skip") for c in report["checks"]]
    assert set(figures.doctor_figures(doctor.read(report), tmp_path).skipped.values()) == {
        "the check was skipped"
    }


def test_the_page_holds_every_section_and_every_image_inside_it(folder: Path) -> None:
    page = html.write_report(folder).read_text()
    for section in ("verdicts", "memorization", "doctor", "utilization"):
        assert f'<section id="{section}">' in page
    images = page.count('<img src="data:image/png;base64,')
    assert images == 1 + len(figures.DRAWERS) == page.count("<img ")  # curve + figures
    assert "http://" not in page.replace("http-equiv", "") and "https://" not in page
    assert "default-src 'none'" in page  # nothing may load from anywhere
    assert "15 pass" in page and "loss at or below 30% of its start" in page
    # no empty section: a comparison or a history only where the job made one
    assert 'id="comparison"' not in page and 'id="history"' not in page
    (folder / "comparison.md").write_text("base against head\n")
    assert '<section id="comparison">' in html.write_report(folder).read_text()
    # each figure's title and healthy line once (inside the PNG; the alt text for readers)
    for kind in figures.DRAWERS:
        assert page.count(figures.HEALTHY[kind].replace("'", "&#39;")) == 1, kind
    # a CPU-only trace: the caption does not ask for a busy GPU (control: a GPU trace's does)
    shutil.copy(folder / "figures" / "grad-flow.png", folder / "utilization.png")
    page = html.write_report(folder).read_text()
    assert "a CPU-only trace: no GPU to keep busy" in page
    assert "healthy: the GPU busy most of each step" not in page
    util = _report("utilization")
    util["gpu_utilization_pct"] = 55.0
    (folder / "utilization.json").write_text(json.dumps(util))
    assert "healthy: the GPU busy most of each step" in html.write_report(folder).read_text()


def test_a_figure_that_is_not_there_is_a_line_that_says_why(folder: Path) -> None:
    report = _report("doctor")
    for check in report["checks"]:
        if check["id"] == "lr-range":
            check.update(status="skip", cause="a train_step of its own sets the rate")
    (folder / "doctor.json").write_text(json.dumps(report))
    (folder / "figures" / "lr-range.png").unlink()
    page = html.write_report(folder).read_text()
    assert 'id="figure-lr-range"' not in page
    assert (
        '<p class="none" id="no-figure-lr-range"><strong>learning-rate range test</strong>: '
        "no figure, the check was skipped: a train_step of its own sets the rate</p>"
    ) in page
    assert 'id="figure-grad-flow"' in page  # control: the others are still drawn


def test_outside_text_is_escaped_with_a_control(folder: Path) -> None:
    report = _report("doctor")
    report["checks"][0]["measured"] = HOSTILE
    report["checks"][0]["status"] = HOSTILE
    report["roots"] = [HOSTILE]
    (folder / "doctor.json").write_text(json.dumps(report))
    (folder / "history.md").write_text(f"# history\n{HOSTILE}\n")
    page = html.write_report(folder).read_text()
    assert "<script>" not in page and "onerror=alert" not in page.replace(
        "onerror=alert(1)&gt;", ""
    )
    assert "&lt;script&gt;" in page
    # control: the same context through the same template without escaping puts it in raw
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.PackageLoader("dlci.report", "templates"), autoescape=False
    )
    raw = env.get_template(html.TEMPLATE).render(**html.build_context(folder))
    assert "<script>alert" in raw


def test_only_what_is_a_png_by_its_bytes_is_embedded(folder: Path, tmp_path: Path) -> None:
    planted = folder / "figures" / "lr-range.png"
    planted.write_text("<html><script>alert(1)</script></html>")  # a report dir is outside input
    outside = tmp_path / "elsewhere.png"
    shutil.copy(folder / "figures" / "grad-flow.png", outside)
    link = folder / "figures" / "grad-flow.png"
    link.unlink()
    link.symlink_to(outside)  # a real PNG, through a link: not followed
    page = html.write_report(folder).read_text()
    assert page.count("<img ") == len(figures.DRAWERS) - 1  # curve + 5 figures - 2 refused
    assert 'id="figure-lr-range"' not in page and 'id="figure-grad-flow"' not in page
    # control: the same PNG as a plain file is embedded
    link.unlink()
    shutil.copy(outside, link)
    assert 'id="figure-grad-flow"' in html.write_report(folder).read_text()


def test_a_folder_with_no_reports_still_renders_and_says_what_is_missing(tmp_path: Path) -> None:
    page = html.write_report(tmp_path).read_text()
    assert page.count(">not run<") == 3  # memorization, doctor, profile
    assert "dlci doctor did not run into this folder" in page
    assert 'id="timing"' not in page  # no run.json: no time table


def test_the_job_page_says_where_the_time_went_and_escapes_the_names(tmp_path: Path) -> None:
    timing = {
        "project": {"tests": 12.25, HOSTILE: 1.0},
        "kit": {"copies_s": 0.5, "containers_s": 3.0},
    }
    (tmp_path / "run.json").write_text(json.dumps({"kind": "run", "timing": timing}))
    page = html.write_report(tmp_path).read_text()
    assert 'id="timing"' in page and "<td>tests</td><td>12.2</td>" in page
    assert "<td>container start and stop</td><td>3.0</td>" in page
    assert "<script>" not in page and "&lt;script&gt;" in page  # the name escaped
    # run.json is read into its classes: one value of a wrong type and no time is shown
    timing["project"]["memorize"] = "lots"
    (tmp_path / "run.json").write_text(json.dumps({"kind": "run", "timing": timing}))
    page = html.write_report(tmp_path).read_text()
    assert 'id="timing"' not in page and "lots" not in page


def test_dlci_report_writes_the_page_and_refuses_a_missing_folder(
    folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch
) -> None:
    out = tmp_path / "elsewhere" / "page.html"
    out.parent.mkdir()
    assert main(["report", str(folder), "--output", str(out)]) == 0
    assert out.read_text().startswith("<!DOCTYPE html>")
    assert main(["report", str(tmp_path / "none")]) == 1
    assert "not a folder" in capsys.readouterr().err
    # alone, it reads ./dlci-artifacts (where the verbs write) and names where it looked
    monkeypatch.chdir(tmp_path)
    assert main(["report"]) == 1
    assert f"dlci-artifacts: not a folder (looked in {tmp_path / 'dlci-artifacts'})" in (
        capsys.readouterr().err
    )
    shutil.copytree(folder, tmp_path / "dlci-artifacts")
    assert main(["report"]) == 0
    assert (tmp_path / "dlci-artifacts" / "report.html").is_file()


@pytest.mark.parametrize(
    "change",
    [
        {"checks": 5},
        {"roots": 7},
        {"counts": {"fail": 1.5, "pass": True}},
        {"counts": {"fail": 1e308 * 10}},  # inf once decoded
        {"checks": [{"id": 10**30, "status": ["x"], "measured": {"a": 1}}]},
    ],
)
def test_hostile_field_types_show_as_missing_not_a_crash(folder: Path, change: dict) -> None:
    """A pull request's report with fields of the wrong type: the page still renders (the
    job's summary and upload must not fail on it), the field shown as missing."""
    report = _report("doctor") | change
    (folder / "doctor.json").write_text(json.dumps(report))
    utilization = _report("utilization")
    utilization["warnings"] = 3
    utilization["memory"]["peak_allocated_bytes"] = 10**30
    (folder / "utilization.json").write_text(json.dumps(utilization))
    page = html.write_report(folder).read_text()
    assert '<section id="doctor">' in page and "Traceback" not in page


def test_an_unreadable_report_or_a_linked_one_is_named_as_such(
    folder: Path, tmp_path: Path
) -> None:
    (folder / "doctor.json").write_text("{not json")
    outside = tmp_path / "outside.json"
    shutil.copy(DATA / "memorization.json", outside)
    (folder / "memorization.json").unlink()
    (folder / "memorization.json").symlink_to(outside)
    page = html.write_report(folder).read_text()
    assert page.count(">unreadable<") == 2
    assert "doctor.json is not a report" in page and "memorization.json is not a report" in page


def test_the_doctor_draws_into_out_only_and_a_figures_file_is_no_crash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Its figures and report.html go into --out, beside doctor.json; with --json elsewhere
    (or the null device) none are written; a file in the way of figures/ is said, and the
    verdict stands (exit 0)."""
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    argv = ["doctor", "--target", "profile_targets:healthy", "--only", "grad-flow"]
    out = tmp_path / "out"
    assert main([*argv, "--out", str(out), "--json", str(tmp_path / "elsewhere.json")]) == 0
    assert not out.exists() and not (tmp_path / "figures").exists()
    assert not (tmp_path / "report.html").exists()
    assert main([*argv, "--out", str(out), "--json", "/dev/null"]) == 0
    assert not out.exists()
    out.mkdir()
    (out / "figures").write_text("in the way")
    capsys.readouterr()
    assert main([*argv, "--out", str(out)]) == 0
    assert "no figures in" in capsys.readouterr().err
    assert json.loads((out / "doctor.json").read_text())["verdict"] == "pass"
    assert (out / "report.html").is_file()  # the page, without figures


def test_tabular_examples_are_an_html_table_and_images_stay_a_picture(folder: Path) -> None:
    import torch

    rows = torch.arange(60, dtype=torch.float32).reshape(12, 5) / 4
    assert figures.examples_figure(rows, torch.arange(12) % 3, folder) is not None
    page = html.write_report(folder).read_text()
    table = page.split('<figure id="figure-examples"><table class="examples">')[1]
    table = table.split("</figure>")[0]
    assert "<th>x0</th><th>x1</th><th>x2</th><th>x3</th><th>x4</th><th>label</th>" in table
    assert "<td>0</td><td>0.25</td><td>0.5</td><td>0.75</td><td>1</td><td>label 0</td>" in table
    assert "(the first 5 of 5 columns)" in table and "<img" not in table
    # control: an image batch is drawn as a picture, and the earlier run's table is gone
    assert figures.examples_figure(torch.rand(4, 1, 8, 8), torch.arange(4), folder) is not None
    assert not (folder / "figures" / "examples.json").exists()
    page = html.write_report(folder).read_text()
    assert '<table class="examples">' not in page
    assert '<figure id="figure-examples"><img src="data:image/png;base64,' in page
