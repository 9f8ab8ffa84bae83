"""Outside names reach no renderer raw: every renderer gets the same hostile names.

A name may carry a terminal escape, a GitHub workflow command, Markdown and HTML, a newline
or mathtext. Each renderer's output is checked for what the name could do there, and the
checks themselves are shown to catch a raw name (the control cases).
"""

from __future__ import annotations

import re
from typing import Any

import msgspec
import pytest

from dlci.compare import diff
from dlci.compare.runs import Changed, MetricPair, RunComparison
from dlci.report import diff_render, doctor, runs, utilization
from dlci.report.github import annotation
from dlci.report.text import bullets, clean, label, md, md_code, table

HOSTILE = ["\x1b[31m", "::error::x", "| # <b>", "a\nb", "$x$"]
ALL = "".join(HOSTILE)  # all of them in one name, too
NAMES = [*HOSTILE, ALL]

# ------------------------------------------------------------------ the checks


def _cells(row: str) -> int:
    """The number of cells of a Markdown table row: its unescaped pipes, less one."""
    return len(re.findall(r"(?<!\\)\|", row)) - 1


def assert_no_raw_controls(text: str) -> None:
    assert "\x1b" not in text, text
    for line in text.splitlines():
        assert not line.lstrip().startswith("::"), line


def assert_safe_markdown(text: str) -> None:
    """No escape, no workflow command, no HTML; every row of a table as wide as its header."""
    assert_no_raw_controls(text)
    assert "<b>" not in text, text
    width = None
    for line in text.splitlines():
        if line.startswith("|"):
            width = _cells(line) if width is None else width
            assert _cells(line) == width, line
        else:
            width = None  # the next table has its own width


def assert_safe_console(text: str, columns: int) -> None:
    """No escape, no workflow command; every body row of a rich table has its columns."""
    assert_no_raw_controls(text)
    for line in text.splitlines():
        if line.startswith("│"):
            assert line.count("│") == columns + 1, line


# ------------------------------------------------------------------ the controls


def test_the_checks_catch_a_raw_name() -> None:
    for raw in ("a \x1b[31m b", "x\n::error::pwned"):
        with pytest.raises(AssertionError):
            assert_safe_markdown(raw)
    with pytest.raises(AssertionError):
        assert_safe_markdown("say <b>hi</b>")
    header = "| a | b |\n|---|---|\n"
    assert_safe_markdown(header + "| x | y |")
    with pytest.raises(AssertionError):
        assert_safe_markdown(header + "| x | | # y |")  # a raw pipe adds a column
    with pytest.raises(AssertionError):
        assert_safe_console("│ a │ b │ c │", 2)


# ------------------------------------------------------------------ text.py itself


def test_clean_shows_controls_as_escapes_and_disarms_workflow_commands() -> None:
    assert clean("a\x1b[31mb") == "a\\x1b[31mb"
    assert clean("a\nb\r\tc") == "a\\nb\\r\\tc"
    assert clean("\u202eevil") == "\\u202eevil"
    assert clean("  ::error::x") == "  \\x3a:error::x"
    assert clean("a::b") == "a::b"  # control: only a leading :: is a command
    assert clean("abcdef", limit=5) == "ab..."
    assert clean(3) == "3"


def test_md_escapes_markup_and_html() -> None:
    assert md("| # <b>") == "\\| \\# &lt;b&gt;"
    assert md("a\nb") == "a\\\\nb"
    assert md("plain words 1.5") == "plain words 1.5"  # control: nothing to escape


def test_md_code_keeps_the_span_closed_and_the_row_whole() -> None:
    assert md_code("a`b|c") == "`a'b\\|c`"
    assert md_code("<b>") == "`&lt;b&gt;`"
    assert md_code("aten::mm") == "`aten::mm`"


def test_label_escapes_mathtext() -> None:
    assert label("$x$") == "\\$x\\$"
    assert label("a\nb") == "a\\nb"
    assert label("x" * 100).endswith("...") and len(label("x" * 100)) == 60


def test_table_keeps_every_row_to_the_header_width() -> None:
    lines = table(["a", "b"], [["x|y", "z"], ["`p\\|q`", "w\nv"]], align="lr")
    assert lines[:2] == ["| a | b |", "|:---|---:|"]
    assert lines[2] == "| x\\|y | z |"
    assert lines[3] == "| `p\\|q` | w v |"
    assert all(_cells(line) == 2 for line in lines)
    assert bullets(["one"]) == ["- one"]


# ------------------------------------------------------------------ every renderer


def _doctor_report(name: str) -> doctor.DoctorReport:
    check = {"status": "fail", "measured": name, "expected": name, "cause": name, "fix": name}
    return doctor.read(
        {
            "verdict": "fail",
            "counts": {"pass": 0, "warn": 0, "fail": 2, "skip": 0},
            "checks": [{"id": name, **check}, {"id": "zero-grad", **check, "status": "warn"}],
        }
    )


@pytest.mark.parametrize("name", NAMES)
def test_doctor_markdown(name: str) -> None:
    text = doctor.render_markdown(_doctor_report(name))
    assert_safe_markdown(text)
    assert sum(line.startswith("| ") for line in text.splitlines()) == 3  # header and 2 rows


@pytest.mark.parametrize("name", NAMES)
def test_doctor_console_table(name: str, capsys) -> None:
    doctor.print_table(_doctor_report(name))
    assert_safe_console(capsys.readouterr().out, columns=5)


def test_the_doctor_fits_a_ci_log_of_120_columns(capsys) -> None:
    """Piped (every CI log), the doctor's results wrap to 120 columns: before, one table row
    was as wide as its longest cell (1,581 columns on the digits example)."""
    long = "held-out loss 0.292 with true labels, 2.3 with shuffled; " * 12 + "x" * 300
    check = {"status": "fail", "measured": long, "expected": long, "cause": long, "fix": long}
    report = {
        "verdict": "fail",
        "reason": long,
        "counts": {"fail": 1},
        "checks": [{"id": "label-alignment", **check}, {"id": "zero-grad", **check}],
    }
    doctor.print_table(doctor.read(report))  # capsys's stream is not a terminal
    lines = capsys.readouterr().out.splitlines()
    assert max(map(len, lines)) <= 120 and len(lines) > 20
    assert "".join(line.strip() for line in lines).count("x" * 200) >= 4  # long words kept
    # the control: the rich table at a log's width, the layout before, does not fit
    from rich.table import Table

    from dlci.report.console import table_console

    grid = Table("check", "measured")
    grid.add_row("label-alignment", long)
    table_console().print(grid)
    assert max(map(len, capsys.readouterr().out.splitlines())) > 120


@pytest.fixture(scope="module")
def utilization_report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from dlci.profiling.metrics import analyze
    from dlci.profiling.reader import read_trace
    from tracegen import training_trace

    path = training_trace(steps=2, kernels=2, item_sync=True)
    report = analyze(read_trace(path.write(tmp_path_factory.mktemp("trace") / "t.json")))
    return msgspec.to_builtins(report)  # type: ignore[no-any-return]


def _hostile_utilization(report: dict[str, Any], name: str) -> dict[str, Any]:
    import copy

    report = copy.deepcopy(report)
    device = report["devices"][0]
    device["name"] = name
    for gap in device["idle_gaps"]:
        gap["cause"] = name
        gap["cpu_op"] = {"name": name, "overlap_us": 1.0}
    for row in report["syncs"]["by_call"]:
        row["call"] = row["caller"] = name
    report["warnings"].append(f"events of unknown categories were ignored: {name} (1)")
    report["recommendations"].append({"id": "x", "finding": name, "advice": name})
    return report


@pytest.mark.parametrize("name", NAMES)
def test_utilization_markdown(name: str, utilization_report: dict[str, Any]) -> None:
    report = _hostile_utilization(utilization_report, name)
    assert report["devices"][0]["idle_gaps"] and report["syncs"]["by_call"]  # rows to check
    text = utilization.render_markdown(utilization.read(report))
    assert_safe_markdown(text)
    rows = [line for line in text.splitlines() if line.startswith("|")]
    unchanged = utilization.render_markdown(utilization.read(utilization_report))
    assert len(rows) == len(unchanged.split("\n|")) - 1


@pytest.mark.parametrize("name", NAMES)
def test_png_labels(name: str) -> None:
    text = label(name)
    assert_no_raw_controls(text)
    assert "\n" not in text
    assert re.search(r"(?<!\\)\$", text) is None, text  # every $ escaped: no mathtext


def _diff_result() -> diff.Diff:
    base = {"gpu_utilization_pct": 80.0, "steps": {"mean_step_us": 1000.0}}
    head = {"gpu_utilization_pct": 70.0, "steps": {"mean_step_us": 1100.0}}
    return diff.compare(utilization.read(base), utilization.read(head), 5.0)


@pytest.mark.parametrize("name", NAMES)
def test_diff_markdown(name: str) -> None:
    text = diff_render.render_markdown(_diff_result(), base=name, head=name)
    assert_safe_markdown(text)


@pytest.mark.parametrize("name", NAMES)
def test_diff_console(name: str, capsys) -> None:
    diff_render.print_table(_diff_result(), base=name, head=name)
    out = capsys.readouterr().out
    assert_safe_console(out, columns=5)
    assert sum(line.startswith("│") for line in out.splitlines()) == 2  # one line a row


@pytest.mark.parametrize("name", NAMES)
def test_compare_runs_console(name: str, capsys) -> None:
    result = RunComparison(
        changed={name: Changed(a=name, b=1.5)}, metrics={"verdict": MetricPair(a=name, b=None)}
    )
    runs.print_table(result, name, name)
    assert_safe_console(capsys.readouterr().out, columns=3)


@pytest.mark.parametrize("name", NAMES)
def test_github_annotation(name: str) -> None:
    line = annotation("error", name, title=name, file=name)
    assert "\n" not in line and "\r" not in line
    assert "\x1b" not in line
    assert line.startswith("::error file=")  # the one command is ours


def test_the_annotation_control_case() -> None:
    from dlci.report.github import escape_data

    assert "\x1b" in escape_data("\x1b[31m")  # workflow-command escaping alone keeps ESC
    assert "\x1b" not in annotation("error", "\x1b[31m")
