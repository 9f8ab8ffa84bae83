"""The pytest plugin gives users' tests the same tier as ``dlci tier``."""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]


def test_the_tier_fixture_follows_the_command_line_option(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        def test_tier(dlci_tier):
            assert (dlci_tier.budget, dlci_tier.hardware_class) == ("nightly", "a100")
            assert dlci_tier.max_loss == 0.05
        """
    )
    result = pytester.runpytest("--dlci-budget", "nightly", "--dlci-hardware", "a100")
    result.assert_outcomes(passed=1)


def test_the_command_line_beats_the_environment_which_beats_the_ini(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makeini("[pytest]\ndlci_budget = merge\ndlci_hardware = t4\n")
    pytester.makepyfile(
        """
        def test_tier(dlci_tier, request):
            expected = request.config.getoption("--expect")
            assert f"{dlci_tier.budget}/{dlci_tier.hardware_class}" == expected
        """
    )
    pytester.makeconftest("def pytest_addoption(parser):\n    parser.addoption('--expect')\n")
    pytester.runpytest("--expect", "merge/t4").assert_outcomes(passed=1)
    monkeypatch.setenv("DLCI_BUDGET", "nightly")
    pytester.runpytest("--expect", "nightly/t4").assert_outcomes(passed=1)
    pytester.runpytest("--expect", "pr/t4", "--dlci-budget", "pr").assert_outcomes(passed=1)


def test_a_bad_ladder_fails_the_test_with_the_located_message(pytester: pytest.Pytester) -> None:
    pytester.makefile(".yaml", ladder="version: 3\n")
    pytester.makepyfile("def test_tier(dlci_tier):\n    pass\n")
    result = pytester.runpytest("--dlci-ladder", "ladder.yaml")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(
        [
            "*dl-ci: ladder.yaml:1: version: unsupported ladder version 3; this dl-ci reads version 1*"
        ]
    )


def test_the_hardware_fixture_detects_this_machine(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    pytester.makepyfile(
        """
        def test_hw(dlci_hardware):
            info, match = dlci_hardware
            assert info.gpus == () and match.name == "cpu"
        """
    )
    pytester.runpytest().assert_outcomes(passed=1)


def test_the_options_are_listed_in_pytest_help(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--help")
    result.stdout.fnmatch_lines(["*--dlci-budget=DLCI_BUDGET*", "*dlci_ladder*"])
