"""Shared fixtures: small ladder files and a clean GitHub Actions environment."""

from __future__ import annotations

from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data"
SMALL_LADDER = DATA / "ladders" / "small.yaml"


@pytest.fixture(autouse=True)
def _no_github_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests start outside GitHub Actions unless they set these themselves."""
    for name in (
        "GITHUB_ACTIONS",
        "GITHUB_OUTPUT",
        "GITHUB_EVENT_NAME",
        "GITHUB_STEP_SUMMARY",
        "DLCI_BUDGET",
        "DLCI_HARDWARE",
        "DLCI_LADDER",
        "CUDA_VISIBLE_DEVICES",
    ):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def small_ladder_text() -> str:
    return SMALL_LADDER.read_text(encoding="utf-8")


@pytest.fixture
def write_ladder(tmp_path: Path):
    """Write ladder text to ``tmp_path/name`` and return the path."""

    def write(text: str, name: str = "ladder.yaml") -> Path:
        path = tmp_path / name
        path.write_text(text, encoding="utf-8")
        return path

    return write
