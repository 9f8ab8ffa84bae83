"""The pytest plugin gives users' tests the same tier as ``dlci tier``."""

from __future__ import annotations

import pytest

# torch imported before any in-process pytester run: pytester puts sys.modules back after each
# run, so a torch first imported inside one is dropped, and importing it again in the next run
# fails in its C extension ("SystemError: bad call flags"); the plugin itself no longer imports
# torch when it loads, so nothing else here did it first
import torch  # noqa: F401

pytest_plugins = ["pytester"]


def test_the_tier_fixture_follows_the_command_line_option(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        def test_tier(dlci_tier):
            assert (dlci_tier.budget, dlci_tier.hardware_class) == ("nightly", "a100")
            assert dlci_tier.max_relative_loss == 0.02
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


def test_the_tier_fixture_takes_the_job_plan_from_its_option_never_from_the_environment(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dlci.ladder.plan import JobPlan, session_plan
    from dlci.ladder.tiers import choose_tier

    tier = choose_tier(budget="pr", hardware="cpu")
    plan = JobPlan(tier.__class__(**{**tier.__dict__, "max_epochs": 7})).to_json()
    pytester.makefile(".json", plan=__import__("json").dumps(plan))
    pytester.makepyfile(
        """
        from dlci.ladder.plan import session_plan

        def test_tier(dlci_tier, request):
            expected = int(request.config.getoption("--expect"))
            assert (dlci_tier.max_epochs == 7) == bool(expected)
            assert (session_plan() == "plan.json") == bool(expected)  # assert_memorizes' default
        """
    )
    pytester.makeconftest("def pytest_addoption(parser):\n    parser.addoption('--expect')\n")
    pytester.runpytest("--expect", "1", "--dlci-plan", "plan.json").assert_outcomes(passed=1)
    assert session_plan() is None  # the session's plan ends with the session
    # control: without the option the tier is selected here; a variable naming the plan is
    # not read (no environment variable carries it)
    monkeypatch.setenv("DLCI_TIER_JSON", str(pytester.path / "plan.json"))
    pytester.runpytest("--expect", "0").assert_outcomes(passed=1)
    pytester.makefile(".json", broken="{")
    result = pytester.runpytest("--expect", "1", "--dlci-plan", "broken.json")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*dl-ci: broken.json: not valid JSON (*"])


def test_a_bad_ladder_fails_the_test_with_the_located_message(pytester: pytest.Pytester) -> None:
    pytester.makefile(".yaml", ladder="version: 3\n")
    pytester.makepyfile("def test_tier(dlci_tier):\n    pass\n")
    result = pytester.runpytest("--dlci-ladder", "ladder.yaml")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(
        [
            "*dl-ci: ladder.yaml:1: version: unsupported ladder version 3; this dl-ci reads versions 1 and 2*"
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
    result.stdout.fnmatch_lines(
        ["*--dlci-budget=DLCI_BUDGET*", "*--dlci-plan=DLCI_PLAN*", "*dlci_ladder*"]
    )


# Tests that import torch run pytest in a subprocess: torch cannot be imported twice in one
# process, which pytester's in-process runs would do.
TINY_TARGET = """
    import torch
    from torch import nn
    import dlci

    def make(lr=0.05):
        torch.manual_seed(0)
        x, y = torch.randn(16, 6), torch.randint(0, 3, (16,))
        model = nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Linear(32, 3))
        return dlci.Target(model, lambda p: torch.optim.Adam(p, lr=lr), [(x, y)],
                           loss_fn=nn.CrossEntropyLoss())

    def make_frozen():
        return make(lr=0.0)
"""


def test_the_memorization_marker_is_registered_with_its_signature(
    pytester: pytest.Pytester,
) -> None:
    result = pytester.runpytest("--markers")
    result.stdout.fnmatch_lines(["@pytest.mark.memorization(target=None): a memorization test*"])


def test_it_passes_a_model_that_memorizes_and_deselects_with_m(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    pytester.makepyfile(tiny=TINY_TARGET)
    pytester.makepyfile(
        test_model="""
        import pytest
        import dlci
        import tiny

        @pytest.mark.memorization
        def test_memorizes(dlci_tier):
            result = dlci.assert_memorizes(tiny.make(), tier=dlci_tier)
            assert result.steps < dlci_tier.max_epochs

        @pytest.mark.memorization(target="tiny:make")
        def test_marker_target(dlci_target):
            dlci.assert_memorizes(dlci_target)

        def test_plain():
            pass
        """
    )
    pytester.syspathinsert()
    pytester.runpytest_subprocess("--dlci-budget", "pr").assert_outcomes(passed=3)
    pytester.runpytest_subprocess("-m", "not memorization").assert_outcomes(passed=1, deselected=2)


def test_it_fails_when_the_loss_never_reaches_the_threshold(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    pytester.makepyfile(tiny=TINY_TARGET)
    pytester.makepyfile(
        test_model="""
        import pytest
        import dlci
        import tiny

        @pytest.mark.memorization
        def test_memorizes(dlci_tier):
            dlci.assert_memorizes(tiny.make_frozen(), tier=dlci_tier)
        """
    )
    pytester.syspathinsert()
    result = pytester.runpytest_subprocess("--dlci-budget", "pr", "--dlci-hardware", "cpu")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*AssertionError: memorization failed at tier pr/cpu: the loss did not fall from its "
            "start: from *",
            "*last losses: *",
            "*A loop that cannot overfit 16 examples cannot learn*",
        ]
    )


def test_the_target_fixture_reads_pyproject(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(tiny=TINY_TARGET)
    pytester.makefile(".toml", pyproject='[tool.dlci]\ntarget = "tiny:make"\n')
    pytester.makepyfile(
        test_model="""
        def test_target(dlci_target):
            assert type(dlci_target.model).__name__ == "Sequential"
        """
    )
    pytester.syspathinsert()
    pytester.runpytest_subprocess().assert_outcomes(passed=1)


def test_a_bad_target_fails_the_test_with_one_message(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_model="""
        import pytest

        @pytest.mark.memorization(target="missing_module:make")
        def test_target(dlci_target):
            pass
        """
    )
    result = pytester.runpytest_subprocess()
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(
        ["*dl-ci: --target missing_module:make: no module named 'missing_module'*"]
    )
