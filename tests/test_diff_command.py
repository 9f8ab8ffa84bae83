"""``dlci compare-profiles`` (alias ``dlci diff``) as a user sees it on the terminal and in files."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from dlci import jsonio
from dlci.cli import main
from dlci.report import diff

# a Markdown table row or rule: what must never reach the terminal
MARKDOWN_ROW = re.compile(r"^\s*\|.*\|\s*$|\|\s*:?-{3}", re.MULTILINE)


def _report(path: Path, util: float | None, step_us: float, data: float, syncs: float) -> str:
    path.write_text(
        json.dumps(
            {
                "schema_version": 1,
                "kind": "utilization",
                "gpu_utilization_pct": util,
                "steps": {"mean_step_us": step_us},
                "phases": {"pct": {"data_loading": data}},
                "syncs": {"per_step": syncs},
            }
        )
    )
    return str(path)


@pytest.fixture
def pair(tmp_path: Path) -> tuple[str, str]:
    """BASE at 80 % and 53.58 ms; HEAD 4 points lower and 3.1 % slower: within a bound of 5."""
    return (
        _report(tmp_path / "base.json", 80.0, 53580.0, 12.0, 1),
        _report(tmp_path / "head.json", 76.0, 55240.0, 13.5, 2),
    )


def test_the_console_shows_a_table_in_ms_with_the_unit_of_every_change(pair, capsys) -> None:
    assert main(["compare-profiles", *pair]) == 0
    out = capsys.readouterr().out
    assert not MARKDOWN_ROW.search(out), out
    assert "e+0" not in out
    rows = {line.split("│")[1].strip(): line for line in out.splitlines() if line.count("│") > 2}
    assert "53.58 ms" in rows["mean step time"] and "55.24 ms" in rows["mean step time"]
    assert "+3.1 %" in rows["mean step time"]
    assert "-4.0 pt" in rows["GPU utilization"] and "80.0 %" in rows["GPU utilization"]
    assert "+1.5 pt" in rows["data loading share"] and "not gated" in rows["data loading share"]
    assert "passed" in out


def test_a_regression_fails_and_is_marked_on_its_row(tmp_path: Path, capsys) -> None:
    base = _report(tmp_path / "b.json", 80.0, 1000.0, 10.0, 0)
    head = _report(tmp_path / "h.json", 70.0, 1000.0, 10.0, 0)
    assert main(["compare-profiles", base, head]) == 1
    out = capsys.readouterr().out
    (row,) = [line for line in out.splitlines() if "GPU utilization" in line and "│" in line]
    assert "-10.0 pt" in row and "regressed" in row
    (row,) = [line for line in out.splitlines() if "mean step time" in line]
    assert "+0.0 %" in row and "1.00 ms" in row and "regressed" not in row
    assert "FAILED" in out


def test_the_old_name_diff_gives_the_same_output(pair, capsys) -> None:
    assert main(["compare-profiles", *pair]) == 0
    new = capsys.readouterr()
    assert main(["diff", *pair]) == 0
    old = capsys.readouterr()
    assert (old.out, old.err) == (new.out, new.err)
    assert "53.58 ms" in old.out


def test_markdown_and_json_go_to_files_each_named_once_written(
    pair, tmp_path: Path, capsys
) -> None:
    md_path, json_path = tmp_path / "diff.md", tmp_path / "diff.json"
    args = ["diff", *pair, "--markdown", str(md_path), "--json", str(json_path)]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert f"wrote {md_path}\n" in out and f"wrote {json_path}\n" in out
    assert not MARKDOWN_ROW.search(out)  # the Markdown is in its file, not on the console
    markdown = md_path.read_text()
    assert "| mean step time | 53.58 ms | 55.24 ms | +3.1 % | ok |" in markdown
    assert "| GPU utilization | 80.0 % | 76.0 % | -4.0 pt | ok |" in markdown
    result = jsonio.decode(json_path.read_bytes())
    assert result["kind"] == "utilization-diff" and result["passed"] is True
    units = {row["metric"]: row["unit"] for row in result["rows"]}
    assert units["gpu_utilization_pct"] == "percentage points"
    assert units["mean_step_us"] == "percent"


def test_json_on_standard_output_stays_parseable(pair, tmp_path: Path, capsys) -> None:
    md_path = tmp_path / "diff.md"
    assert main(["diff", *pair, "--json", "--markdown", str(md_path)]) == 0
    captured = capsys.readouterr()
    assert jsonio.decode(captured.out.encode())["passed"] is True
    assert captured.err == f"wrote {md_path}\n"


def test_without_files_nothing_says_wrote(pair, capsys) -> None:
    assert main(["diff", *pair]) == 0
    captured = capsys.readouterr()
    assert "wrote" not in captured.out + captured.err


def test_help_says_it_compares_utilization_reports(capsys) -> None:
    for verb in ("compare-profiles", "diff"):
        with pytest.raises(SystemExit) as exit_:
            main([verb, "--help"])
        assert exit_.value.code == 0
        out = " ".join(capsys.readouterr().out.split())
        assert "Compare two UTILIZATION reports" in out
        assert "alias: dlci diff" in out and "dlci compare-runs" in out


def test_the_cli_help_lists_the_new_names_with_their_aliases(capsys) -> None:
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    (profiles,) = [line for line in out.splitlines() if line.startswith("  compare-profiles ")]
    assert "utilization reports" in profiles and "alias: diff" in profiles
    (runs,) = [line for line in out.splitlines() if line.startswith("  compare-runs ")]
    assert "memorization runs" in runs and "alias: compare" in runs


def test_compare_keeps_the_regression_rules() -> None:
    base = {"gpu_utilization_pct": 80.0, "steps": {"mean_step_us": 1000.0}}
    slower = {"gpu_utilization_pct": 80.0, "steps": {"mean_step_us": 1060.0}}
    result = diff.compare(base, slower, 5.0)
    assert [r["metric"] for r in result["regressions"]] == ["mean_step_us"]
    assert result["compared"] == 2
    # control: a drop of exactly the bound passes, in points, not percent of 80
    lower = {"gpu_utilization_pct": 75.0, "steps": {"mean_step_us": 1000.0}}
    assert diff.compare(base, lower, 5.0)["passed"] is True
    no_steps = {"gpu_utilization_pct": None, "steps": {"mean_step_us": 0.0}}
    assert diff.compare(base, no_steps, 5.0)["compared"] == 0


def test_nothing_to_compare_is_a_user_error(tmp_path: Path, capsys) -> None:
    base = _report(tmp_path / "b.json", None, 0.0, 10.0, 0)
    assert main(["compare-profiles", base, base]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: nothing to compare")
    assert "Traceback" not in err
