"""Shared fixtures: small ladder files and a clean GitHub Actions environment."""

from __future__ import annotations

import os
import stat
import sys
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


@pytest.fixture
def fake_docker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Put a stand-in `docker` first on PATH that runs the given Python body.

    The body runs with ``json``, ``sys`` and ``time`` imported; ``install(body)`` may be called
    again to change what the stand-in does. Its folder is ``tmp_path / "bin"``.
    """

    def install(body: str) -> None:
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir(exist_ok=True)
        script = bin_dir / "docker"
        script.write_text(f"#!{sys.executable}\nimport json, sys, time\n{body}\n")
        script.chmod(script.stat().st_mode | stat.S_IEXEC)
        monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")

    return install
