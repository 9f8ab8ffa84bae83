"""``dlci compare-profiles`` (alias ``dlci diff``) as a user sees it on the terminal and in files."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from dlci import jsonio
from dlci.cli import main
from dlci.compare import diff
from dlci.report.utilization import read

# a Markdown table row or rule: what must never reach the terminal
MARKDOWN_ROW = re.compile(r"^\s*\|.*\|\s*$|\|\s*:?-{3}", re.MULTILINE)


def _steps(util: float | None, ms: float, n: int = 10, jitter: float = 0.002) -> list[dict]:
    """n profiled steps around ``ms`` and ``util``, scattered by ``jitter`` (a fraction)."""
    wobble = [(-1) ** i * (i % 5) / 4 * jitter for i in range(n)]
    return [
        {
            "duration_us": ms * 1e3 * (1 + w),
            "gpu_utilization_pct": None if util is None else util + 10 * w,
        }
        for w in wobble
    ]


def _report(
    path: Path,
    util: float | None,
    step_ms: float,
    data: float,
    syncs: float,
    *,
    steps: list[dict] | None = None,
    gpu: str = "NVIDIA A100-SXM4-80GB",
    torch: str | None = None,
) -> str:
    per_step = _steps(util, step_ms) if steps is None else steps
    path.write_text(
        json.dumps(
            {
                "schema_version": 1,
                "kind": "utilization",
                "trace": {"device_names": {"0": gpu}, "torch_version": torch},
                "gpu_utilization_pct": util,
                "steps": {"mean_step_us": step_ms * 1e3},
                "per_step": per_step,
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
        _report(tmp_path / "base.json", 80.0, 53.58, 12.0, 1),
        _report(tmp_path / "head.json", 76.0, 55.24, 13.5, 2),
    )


def _rows(out: str) -> dict[str, str]:
    return {line.split("│")[1].strip(): line for line in out.splitlines() if line.count("│") > 2}


def test_the_console_shows_a_table_in_ms_with_the_unit_of_every_change(pair, capsys) -> None:
    assert main(["compare-profiles", *pair]) == 0
    out = capsys.readouterr().out
    assert not MARKDOWN_ROW.search(out), out
    assert "e+0" not in out
    rows = _rows(out)
    step = rows["step time (median)"]
    assert "53.58 ms" in step and "55.24 ms" in step and "ok" in step
    assert re.search(r"\+3\.1 % \[\+\d\.\d, \+\d\.\d\]", step), step
    assert "-4.0 pt [" in rows["GPU utilization"] and "80.0 %" in rows["GPU utilization"]
    assert "+1.5 pt" in rows["data loading share"] and "not gated" in rows["data loading share"]
    assert "passed" in out


def test_a_regression_fails_and_is_marked_on_its_row(tmp_path: Path, capsys) -> None:
    base = _report(tmp_path / "b.json", 80.0, 1.0, 10.0, 0)
    head = _report(tmp_path / "h.json", 70.0, 1.0, 10.0, 0)
    assert main(["compare-profiles", base, head]) == 1
    out = capsys.readouterr().out
    (row,) = [line for line in out.splitlines() if "GPU utilization" in line and "│" in line]
    assert "-10.0 pt" in row and "regressed" in row
    (row,) = [line for line in out.splitlines() if "step time" in line and "│" in line]
    assert "+0.0 %" in row and "1.00 ms" in row and "regressed" not in row
    assert "FAILED" in out
    assert "GPU utilization: regressed: worse by more than 5 pt" in out


def test_each_bound_can_be_set_alone(tmp_path: Path, capsys) -> None:
    base = _report(tmp_path / "b.json", 80.0, 1.0, 10.0, 0)
    head = _report(tmp_path / "h.json", 70.0, 1.0, 10.0, 0)
    assert main(["diff", base, head, "--max-utilization-drop", "12"]) == 0
    assert main(["diff", base, head, "--max-step-time-regression", "1"]) == 1  # util still 5
    assert "bounds: 5 pt of GPU utilization, 1 % of step time" in capsys.readouterr().out


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
    assert re.search(
        r"\| step time \(median\) \| 53.58 ms \| 55.24 ms \| \+3.1 % \[.*\] \| ok \|", markdown
    )
    assert re.search(r"\| GPU utilization \| 80.0 % \| 76.0 % \| -4.0 pt \[.*\] \| ok \|", markdown)
    result = jsonio.decode(json_path.read_bytes())
    assert result["kind"] == "utilization-diff" and result["passed"] is True
    assert result["schema_version"] == 2
    units = {row["metric"]: row["unit"] for row in result["rows"]}
    assert units["gpu_utilization_pct"] == "percentage points"
    assert units["step_time_us"] == "percent"


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
    base = {"gpu_utilization_pct": 80.0, "per_step": _steps(80.0, 1.0)}
    slower = {"gpu_utilization_pct": 80.0, "per_step": _steps(80.0, 1.06)}
    base, slower = read(base), read(slower)
    result = diff.compare(base, slower, 5.0)
    assert [r.metric for r in result.regressions] == ["step_time_us"]
    assert result.compared == 2
    # control: a drop of about the bound, in points (not percent of 80), does not fail
    lower = read({"gpu_utilization_pct": 75.0, "per_step": _steps(75.0, 1.0)})
    assert diff.compare(base, lower, 5.0).passed is True
    no_steps = read({"gpu_utilization_pct": None, "steps": {"mean_step_us": 0.0}})
    assert diff.compare(base, no_steps, 5.0).compared == 0


def _gpu_steps(values_us: list[float]) -> list[dict]:
    return [{"duration_us": us, "gpu_utilization_pct": 80.0} for us in values_us]


def _step_row(capsys) -> dict:
    rows = json.loads(capsys.readouterr().out)["rows"]
    (step,) = [r for r in rows if r["metric"] == "step_time_us"]
    return step


def test_the_old_alarm_on_means_of_a_few_steps_is_gone(tmp_path: Path, capsys) -> None:
    """Three steps, one of them stalled by the machine: the means say +371%."""
    stalled = _gpu_steps([100e3, 101e3, 1213e3])
    base = _report(tmp_path / "b.json", 80.0, 100.0, 0.0, 0, steps=_steps(80.0, 100.0, n=3))
    head = _report(tmp_path / "h.json", 80.0, 471.0, 0.0, 0, steps=stalled)
    assert main(["diff", base, head, "--json"]) == 0
    step = _step_row(capsys)
    assert step["verdict"] == "inconclusive"
    assert "too few profiled steps (3 and 3)" in step["reason"]
    # with ten steps, one stall moves the median, not the verdict
    ten = _gpu_steps([100e3 * (1 + i / 1000) for i in range(9)] + [1213e3])
    head = _report(tmp_path / "h.json", 80.0, 211.0, 0.0, 0, steps=ten)
    base = _report(tmp_path / "b.json", 80.0, 100.0, 0.0, 0, steps=_steps(80.0, 100.0, n=10))
    assert main(["diff", base, head, "--json"]) == 0
    assert _step_row(capsys)["verdict"] == "ok"


def test_runs_on_other_gpus_or_torch_versions_are_not_comparable(tmp_path: Path, capsys) -> None:
    base = _report(tmp_path / "b.json", 80.0, 1.0, 10.0, 0, torch="2.5.1")
    head = _report(tmp_path / "h.json", 60.0, 1.0, 10.0, 0, torch="2.5.1")
    assert main(["diff", base, head]) == 1  # control: the same GPU and torch, a real drop
    capsys.readouterr()
    for extra in ({"torch": "2.6.0"}, {"gpu": "NVIDIA H100 80GB HBM3", "torch": "2.5.1"}):
        head = _report(tmp_path / "h.json", 60.0, 1.0, 10.0, 0, **extra)
        assert main(["diff", base, head]) == 0
        captured = capsys.readouterr()
        assert "not comparable" in _rows(captured.out)["GPU utilization"]
        assert "warning: nothing was gated: the runs are not comparable" in captured.err


def test_cpu_only_traces_have_no_utilization_to_compare(tmp_path: Path, capsys) -> None:
    base = _report(tmp_path / "b.json", None, 1.0, 10.0, 0)
    head = _report(tmp_path / "h.json", 80.0, 1.0, 10.0, 0)
    assert main(["diff", base, head, "--json"]) == 0
    rows = {r["metric"]: r for r in json.loads(capsys.readouterr().out)["rows"]}
    util = rows["gpu_utilization_pct"]
    assert util["verdict"] == "not comparable" and "CPU-only trace (base)" in util["reason"]


# two 5-step profiles of the unchanged digits example here, a minute apart, on a CPU that other
# jobs shared: each run steady, the second a third slower as a whole (run-level load)
RUN_A_MS = [363.7, 360.0, 383.6, 376.2, 384.0]
RUN_B_MS = [523.2, 503.5, 500.5, 491.9, 512.0]


def test_a_cpu_only_step_time_is_measured_never_gated(tmp_path: Path, capsys) -> None:
    def times(values: list[float], util: float | None) -> list[dict]:
        return [{"duration_us": ms * 1e3, "gpu_utilization_pct": util} for ms in values]

    base = _report(tmp_path / "b.json", None, 370.0, 0.0, 0, steps=times(RUN_A_MS, None))
    head = _report(tmp_path / "h.json", None, 506.0, 0.0, 0, steps=times(RUN_B_MS, None))
    assert main(["diff", base, head, "--json"]) == 0
    step = _step_row(capsys)
    assert step["verdict"] == "not comparable" and "shared host CPU" in step["reason"]
    assert step["low"] > 25  # measured: +36% [+30, +42], yet the code did not change
    # control: the same steps on a GPU trace are judged, and the steady shift regresses (the
    # statistics of one run's steps cannot see a whole run slowed; the CPU rule is what spares it)
    base = _report(tmp_path / "b.json", 80.0, 370.0, 0.0, 0, steps=times(RUN_A_MS, 80.0))
    head = _report(tmp_path / "h.json", 80.0, 506.0, 0.0, 0, steps=times(RUN_B_MS, 80.0))
    assert main(["diff", base, head, "--json"]) == 1
    assert _step_row(capsys)["verdict"] == "regressed"


# per-step times (ms) of the digits example profiled twice on this 2-core machine, the second
# time next to a busy loop: the load slows the steps and scatters them
STEADY_MS = [259.7, 260.0, 256.0, 259.9, 260.2, 259.7, 259.9, 260.1, 259.9, 259.9]
LOADED_MS = [384.1, 407.3, 394.7, 373.2, 384.2, 92.6, 255.1, 408.1, 380.1, 383.1]


def test_a_run_disturbed_by_load_is_inconclusive(tmp_path: Path, capsys) -> None:
    """The same step times as if on a GPU trace (a CPU-only one is never gated)."""

    def times(values: list[float]) -> list[dict]:
        return _gpu_steps([ms * 1e3 for ms in values])

    base = _report(tmp_path / "b.json", 80.0, 260.0, 0.0, 0, steps=times(STEADY_MS))
    head = _report(tmp_path / "h.json", 80.0, 346.0, 0.0, 0, steps=times(LOADED_MS))
    assert main(["diff", base, head]) == 0
    captured = capsys.readouterr()
    assert "scatter unequally" in captured.out and "inconclusive" in captured.err
    # control: the same slowdown without the scatter (each step 1.48 times longer) regresses
    slower = [ms * 1.48 for ms in STEADY_MS]
    steady = _report(tmp_path / "s.json", 80.0, 384.0, 0.0, 0, steps=times(slower))
    assert main(["diff", base, steady]) == 1


@pytest.mark.parametrize(
    ("steps", "message"),
    [
        ({"x": 1}, "per_step: expected a list, got an object"),
        ([1], "per_step[0]: expected an object, got 1"),
        ([{"duration_us": "9"}], "per_step[0].duration_us: expected a number, got '9'"),
        ([{"gpu_utilization_pct": 101}], "per_step[0].gpu_utilization_pct: expected a number from"),
    ],
)
def test_mistyped_per_step_fields_name_the_file_and_key(tmp_path, capsys, steps, message) -> None:
    good = _report(tmp_path / "good.json", 80.0, 1.0, 0.0, 0)
    bad = _report(tmp_path / "bad.json", 80.0, 1.0, 0.0, 0, steps=steps)
    assert main(["diff", good, bad]) == 1
    err = capsys.readouterr().err
    assert f"bad.json: {message}" in err and "Traceback" not in err


def test_nothing_to_compare_is_a_user_error(tmp_path: Path, capsys) -> None:
    base = _report(tmp_path / "b.json", None, 0.0, 10.0, 0, steps=[])
    assert main(["compare-profiles", base, base]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: nothing to compare")
    assert "Traceback" not in err


def test_three_steps_each_all_worse_are_a_likely_regression_blocking_when_asked(
    tmp_path: Path, capsys
) -> None:
    """The PR tier's few steps: a 15-point drop on every step is no noise, though no 95%
    interval exists for 3 and 3 steps. Reported as likely regressed (exit 0 and a warning),
    exit 1 with --block-likely; control: the same three steps mixed with the base's."""

    def steps(utils: list[float]) -> list[dict]:
        return [{"duration_us": 100e3, "gpu_utilization_pct": u} for u in utils]

    base = _report(tmp_path / "b.json", 70.3, 100.0, 0.0, 0, steps=steps([70.1, 71.0, 69.8]))
    head = _report(tmp_path / "h.json", 55.5, 100.0, 0.0, 0, steps=steps([55.0, 56.2, 55.3]))
    assert main(["diff", base, head, "--max-regression", "5"]) == 0
    captured = capsys.readouterr()
    assert "likely regressed" in captured.out and "--block-likely" in captured.err
    assert main(["diff", base, head, "--max-regression", "5", "--block-likely"]) == 1
    capsys.readouterr()
    mixed = _report(tmp_path / "m.json", 63.0, 100.0, 0.0, 0, steps=steps([55.0, 70.5, 55.3]))
    assert main(["diff", base, mixed, "--max-regression", "5", "--block-likely"]) == 0
    assert "inconclusive" in capsys.readouterr().out
