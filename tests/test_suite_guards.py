"""The suite's own guard (tests/conftest.py): a test file may not leave a process global changed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

CONFTEST = (Path(__file__).parent / "conftest.py").read_text(encoding="utf-8")

LEAKS = """
import sys


def test_leaks_the_digit_limit():
    sys.set_int_max_str_digits(0)


def test_after_it():
    pass
"""

PUTS_BACK = """
import sys

import pytest


@pytest.fixture(scope="module")
def no_limit():
    was = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(0)  # for the whole file, put back after its last test
    yield
    sys.set_int_max_str_digits(was)


def test_one(no_limit, monkeypatch):
    monkeypatch.setenv("DLCI_SUITE_GUARD", "1")
    monkeypatch.chdir("/")
    assert int("9" * 5000) > 0


def test_two(no_limit):
    assert int("9" * 5000) > 0
"""


def test_a_file_that_leaves_a_global_changed_errors_at_its_last_teardown(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_leaky=LEAKS)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2, errors=1)
    result.stdout.fnmatch_lines(
        ["*the tests of test_leaky.py left process globals changed*sys.get_int_max_str_digits()*"]
    )


def test_control_what_is_put_back_by_fixtures_and_monkeypatch_passes(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_tidy=PUTS_BACK)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)


# ------------------------------------------------ the time per test file (benchmarks/)

JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" tests="4">
<testcase classname="tests.e2e.test_act" name="test_a" time="30.0"/>
<testcase classname="tests.e2e.test_act" name="test_b" time="12.5"/>
<testcase classname="tests.test_stats.TestMedian" name="test_c" time="0.5"/>
<testcase classname="src.dlci.stats" name="dlci.stats.median" time="0.25"/>
</testsuite></testsuites>
"""


def _times(monkeypatch: pytest.MonkeyPatch):
    import importlib.util
    import sys

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "test_times.py"
    spec = importlib.util.spec_from_file_location("test_times", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "test_times", module)  # dataclasses look it up there
    spec.loader.exec_module(module)
    return module


def test_the_table_sums_each_file_and_warns_over_budget_naming_what_grew(
    tmp_path: Path, capsys, monkeypatch
) -> None:
    times = _times(monkeypatch)
    junit = tmp_path / "junit.xml"
    junit.write_text(JUNIT)
    kept = tmp_path / "kept.json"
    assert times.main([str(junit), "--kept", str(kept), "--save", "--elapsed-s", "60"]) == 0
    saved = json.loads(kept.read_text())
    assert saved["files"]["tests/e2e/test_act.py"] == {"tests": 2, "seconds": 42.5}
    assert saved["files"]["tests/test_stats.py"] == {"tests": 1, "seconds": 0.5}  # the class
    assert saved["files"]["src/dlci/stats.py"]["tests"] == 1  # a doctest: its module
    assert saved["tests"] == 4 and saved["wall_s"] == 60
    capsys.readouterr()

    junit.write_text(JUNIT.replace('time="30.0"', 'time="90.0"'))
    assert (
        times.main([str(junit), "--kept", str(kept), "--budget-s", "100", "--elapsed-s", "120"])
        == 0
    )
    out = capsys.readouterr().out
    assert "+60.0" in out  # the change against the kept table
    assert "over its budget of 2 min" in out
    assert "tests/e2e/test_act.py (42 s -> 102 s)" in out
    assert "test_stats" not in out.split("warning:")[1]  # what did not grow is not named
    # the control: under the budget, no warning, whatever grew
    assert (
        times.main([str(junit), "--kept", str(kept), "--budget-s", "200", "--elapsed-s", "120"])
        == 0
    )
    assert "warning" not in capsys.readouterr().out
