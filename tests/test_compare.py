"""``dlci compare-runs`` (alias ``dlci compare``): what changed between two runs, and a warning when it is more than one thing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dlci.cli import main

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "digits"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Three real runs of the example: a baseline, another seed, and another seed and budget."""
    mp = pytest.MonkeyPatch()
    mp.chdir(EXAMPLE)
    mp.syspath_prepend(str(EXAMPLE))
    mp.setenv("CUDA_VISIBLE_DEVICES", "")
    base = tmp_path_factory.mktemp("runs")
    try:
        for name, extra in {
            "a": [],
            "seed": ["--seed", "3"],
            "two": ["--seed", "3", "--budget", "merge"],
        }.items():
            assert main(
                [
                    "memorize",
                    "--out",
                    str(base / name),
                    "--quiet",
                    "--tracker",
                    "none",
                    "--budget",
                    "pr",
                    *extra,
                ]
            ) in (0, 1)
    finally:
        mp.undo()
    return base


def test_one_change_is_listed_without_a_warning(runs, capsys) -> None:
    assert main(["compare", str(runs / "a"), str(runs / "seed"), "--json"]) == 0
    captured = capsys.readouterr()
    result = json.loads(captured.out)
    assert result["changed"] == {"seed": {"a": 0, "b": 3}}
    assert result["warning"] == ""
    assert result["metrics"]["verdict"] == {"a": "pass", "b": "pass", "difference": "same"}
    assert result["not_comparable"] == []
    assert "warning" not in captured.err


def test_two_changes_warn_that_the_comparison_tells_nothing(runs, capsys) -> None:
    assert main(["compare", str(runs / "a"), str(runs / "two" / "memorization.json")]) == 0
    captured = capsys.readouterr()
    assert "what changed" in captured.out
    assert captured.err.startswith("warning: ")
    assert "cannot tell which change mattered; change one thing at a time" in captured.err
    assert "seed" in captured.err and "tier.budget" in captured.err


def test_a_file_that_is_not_a_report_is_refused(tmp_path, capsys) -> None:
    bogus = tmp_path / "x.json"
    bogus.write_text('{"kind": "utilization"}')
    assert main(["compare", str(bogus), str(bogus)]) == 1
    assert capsys.readouterr().err.startswith(f"error: {bogus}: not a memorization report")


def test_the_new_name_and_the_old_one_give_the_same_output(runs, capsys) -> None:
    assert main(["compare-runs", str(runs / "a"), str(runs / "two")]) == 0
    new = capsys.readouterr()
    assert main(["compare", str(runs / "a"), str(runs / "two")]) == 0
    old = capsys.readouterr()
    assert (old.out, old.err) == (new.out, new.err)
    assert "what changed" in new.out and "results" in new.out


def test_help_says_it_compares_memorization_runs(capsys) -> None:
    for verb in ("compare-runs", "compare"):
        with pytest.raises(SystemExit) as exit_:
            main([verb, "--help"])
        assert exit_.value.code == 0
        out = " ".join(capsys.readouterr().out.split())
        assert out.startswith("usage: dlci compare-runs ")
        assert "Compare two MEMORIZATION runs" in out
        assert "alias: dlci compare" in out and "dlci compare-profiles" in out


def _edited(source: Path, dest: Path, **versions) -> Path:
    report = json.loads((source / "memorization.json").read_text())
    report["config"]["versions"].update(versions)
    dest.write_text(json.dumps(report))
    return dest


def test_runs_on_another_torch_are_flagged_not_comparable(runs, tmp_path, capsys) -> None:
    same = _edited(runs / "a", tmp_path / "same.json")
    assert main(["compare", str(runs / "a"), str(same), "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["not_comparable"] == []  # control: the same torch
    assert "not comparable" not in captured.err
    other = _edited(runs / "a", tmp_path / "other.json", torch="1.13.1")
    assert main(["compare", str(runs / "a"), str(other)]) == 0
    err = capsys.readouterr().err
    assert err.startswith("warning: not comparable: torch ")
    assert "(RUN_A) and 1.13.1 (RUN_B)" in err


def test_the_results_table_says_how_run_b_differs(runs, capsys) -> None:
    assert main(["compare", str(runs / "a"), str(runs / "seed"), "--json"]) == 0
    metrics = json.loads(capsys.readouterr().out)["metrics"]
    steps = metrics["steps"]
    if steps["a"] == steps["b"]:
        assert steps["difference"] == "same"
    else:
        assert steps["difference"].startswith(f"{steps['b'] - steps['a']:+d} (x")
    assert metrics["wall_time_s"]["difference"] == "one timing per run: not judged"
