"""pytest plugin (entry point ``dlci``): the detected hardware and the selected tier as fixtures.

Settings resolve in one place, in this order: command line, environment, ini file.

    pytest --dlci-budget nightly          # or DLCI_BUDGET=nightly, or dlci_budget = nightly
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from dlci.budgets import Tier
    from dlci.hardware import ClassMatch, HardwareInfo

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
}


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("dlci", "dl-ci: deep-learning CI gates")
    for name, (_env, help_text, _default) in SETTINGS.items():
        group.addoption(f"--dlci-{name}", dest=f"dlci_{name}", default=None, help=help_text)
        parser.addini(f"dlci_{name}", help_text, default=None)


def setting(config: pytest.Config, name: str) -> str | None:
    """One setting, resolved command line > environment > ini > default."""
    env, _help, default = SETTINGS[name]
    value: Any = config.getoption(f"dlci_{name}")
    if value is None:
        value = os.environ.get(env) or None
    if value is None:
        value = config.getini(f"dlci_{name}") or None
    return value if value is not None else default


@pytest.fixture(scope="session")
def dlci_hardware(pytestconfig: pytest.Config) -> tuple[HardwareInfo, ClassMatch]:
    """The machine's GPUs (``HardwareInfo``) and its hardware class (``ClassMatch``)."""
    from dlci import hardware
    from dlci.budgets import load_ladder

    info = hardware.detect()
    return info, hardware.classify(info, load_ladder(setting(pytestconfig, "ladder")))


@pytest.fixture(scope="session")
def dlci_tier(pytestconfig: pytest.Config) -> Tier:
    """The memorization tier selected for this run, exactly as ``dlci tier`` selects it."""
    from dlci.errors import DlciError
    from dlci.tiering import choose_tier

    try:
        return choose_tier(
            budget=setting(pytestconfig, "budget") or "auto",
            hardware=setting(pytestconfig, "hardware") or "auto",
            ladder=setting(pytestconfig, "ladder"),
        )
    except DlciError as exc:
        pytest.fail(f"dl-ci: {exc}", pytrace=False)
