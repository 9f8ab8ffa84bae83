"""pytest plugin (entry point ``dlci``): the detected hardware and the selected tier as fixtures.

Settings resolve in one place, in this order: command line, environment, ini file; the
target and the ladder then fall back on the project's configuration (dlci.toml or
``[tool.dlci]``), through ``dlci.config.resolve`` as every other command reads them.

    pytest --dlci-budget nightly          # or DLCI_BUDGET=nightly, or dlci_budget = nightly
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import pytest

from dlci.errors import DlciError

if TYPE_CHECKING:
    from dlci.hardware import HardwareInfo
    from dlci.ladder.classes import ClassMatch
    from dlci.ladder.load import Tier

# name -> (environment variable, help shared by the option and the ini key, default)
SETTINGS: dict[str, tuple[str, str, str | None]] = {
    "budget": (
        "DLCI_BUDGET",
        "dl-ci budget: auto (follows GITHUB_EVENT_NAME), pr, merge or nightly",
        "auto",
    ),
    "hardware": (
        "DLCI_HARDWARE",
        "dl-ci hardware class: auto (detect) or a class of the ladder such as a100",
        "auto",
    ),
    "ladder": ("DLCI_LADDER", "dl-ci budget ladder file (default: dl-ci's own)", None),
    "target": (
        "DLCI_TARGET",
        "dl-ci target, package.module:function returning dlci.Target "
        "(default: target in dlci.toml, or [tool.dlci] in pyproject.toml)",
        None,
    ),
}

PLAN_HELP = (
    "dl-ci job plan file (the host's preflight.json: dlci run passes it): the tier of the "
    "dlci_tier fixture and of dlci.assert_memorizes(), used as it is"
)

MARKER = (
    "memorization(target=None): a memorization test, which overfits one batch within the "
    "selected tier; target='package.module:function' gives the dlci_target fixture its target. "
    "Deselect with -m 'not memorization'."
)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("dlci", "dl-ci: deep-learning CI gates")
    for name, (_env, help_text, _default) in SETTINGS.items():
        group.addoption(f"--dlci-{name}", dest=f"dlci_{name}", default=None, help=help_text)
        parser.addini(f"dlci_{name}", help_text, default=None)
    group.addoption("--dlci-plan", dest="dlci_plan", default=None, help=PLAN_HELP)
    parser.addini("dlci_plan", PLAN_HELP, default=None)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", MARKER)
    path = plan(config)
    if path:  # for assert_memorizes() without a tier
        # ladder.plan (msgspec, yaml): loaded with a plan only, not in every user's pytest run
        from dlci.ladder.plan import use_in_tests

        use_in_tests(path)


def pytest_unconfigure(config: pytest.Config) -> None:
    if plan(config):
        # ladder.plan (msgspec, yaml): loaded with a plan only, not in every user's pytest run
        from dlci.ladder.plan import use_in_tests

        use_in_tests(None)


def plan(config: pytest.Config) -> str | None:
    """The job plan's file: --dlci-plan, else the ini key (no environment variable)."""
    value = config.getoption("dlci_plan", None) or config.getini("dlci_plan") or None
    return str(value) if value else None


CURRENT_TEST_VARIABLE = "DLCI_CURRENT_TEST_FILE"


def pytest_runtest_logstart(nodeid: str, location: Any) -> None:
    """Under ``dlci run``, note the test about to run: if the process is killed (out of
    memory, a timeout), the job can still say which test it was running."""
    path = os.environ.get(CURRENT_TEST_VARIABLE)
    if path:
        try:
            with open(path, "w", encoding="utf-8") as handle:
                handle.write(nodeid)
        except OSError:
            pass


def setting(config: pytest.Config, name: str) -> str | None:
    """One setting, resolved command line > environment > ini > default; ``target`` and
    ``ladder`` through :func:`configured`."""
    if name in CONFIGURED:
        return configured(config, name)
    env, _help, default = SETTINGS[name]
    value: Any = config.getoption(f"dlci_{name}")
    if value is None:
        value = os.environ.get(env) or None
    if value is None:
        value = config.getini(f"dlci_{name}") or None
    return value if value is not None else default


CONFIGURED = ("target", "ladder")  # keys of dlci.config


def configured(config: pytest.Config, name: str) -> str | None:
    """``target`` or ``ladder`` through ``dlci.config.resolve``: the option is its command
    line; the ini key keeps its place below the environment (and the action's input) and
    above the configuration file."""
    # dlci.config (msgspec, yaml): when a test asks for a fixture, not in every pytest run
    from dlci.config.resolve import ACTION_INPUT, COMMAND_LINE, ENVIRONMENT, resolve

    resolved = resolve({name: config.getoption(f"dlci_{name}")})
    ini = config.getini(f"dlci_{name}") or None
    if ini and resolved.source(name) not in (COMMAND_LINE, ACTION_INPUT, ENVIRONMENT):
        return str(ini)
    value = resolved.get(name)
    return None if value is None else str(value)


@pytest.fixture(scope="session")
def dlci_hardware(pytestconfig: pytest.Config) -> tuple[HardwareInfo, ClassMatch]:
    """The machine's GPUs (``HardwareInfo``) and its hardware class (``ClassMatch``)."""
    # the ladder (msgspec, yaml) and the probes: when a test asks for them, not in every run
    from dlci.ladder.classes import detect_class

    try:
        return detect_class(setting(pytestconfig, "ladder"))
    except DlciError as exc:
        pytest.fail(f"dl-ci: {exc}", pytrace=False)


@pytest.fixture(scope="session")
def dlci_tier(pytestconfig: pytest.Config) -> Tier:
    """The memorization tier selected for this run, exactly as ``dlci tier`` selects it; under
    ``dlci run``, the job plan's (``--dlci-plan``), used as it is."""
    # the ladder (msgspec, yaml): when a test asks for the tier, not in every pytest run
    from dlci.ladder.tiers import choose_tier

    try:
        given = plan(pytestconfig)
        return choose_tier(
            budget=setting(pytestconfig, "budget") or "auto",
            hardware=setting(pytestconfig, "hardware") or "auto",
            ladder=None if given else configured(pytestconfig, "ladder"),
            plan=given,
        )
    except DlciError as exc:
        pytest.fail(f"dl-ci: {exc}", pytrace=False)


@pytest.fixture
def dlci_target(request: pytest.FixtureRequest) -> Any:
    """A fresh ``dlci.Target``: from the test's ``memorization(target=...)`` marker, else the
    ``--dlci-target`` option, $DLCI_TARGET, the ini key, or the configuration's ``target``."""
    # torch: when a test asks for a target, never in a plain pytest run
    from dlci.memorization.engine import seed_everything
    from dlci.training.target import load_target, resolve_spec  # torch, as above

    marker = request.node.get_closest_marker("memorization")
    try:
        spec = (marker.kwargs.get("target") if marker else None) or setting(
            request.config, "target"
        )
        seed_everything(0)
        return load_target(resolve_spec(spec))
    except DlciError as exc:
        pytest.fail(f"dl-ci: {exc}", pytrace=False)
