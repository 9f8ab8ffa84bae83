"""How a candidate commit's code reaches its gate run: the worktree's source on PYTHONPATH
(``path``, the default: no build, nothing written outside the worktree), or the commit
installed by pip into a folder of its own (``pip``: ``pip install --no-deps
--no-build-isolation --target DIR``, then DIR on PYTHONPATH). Either way the commit's code
comes first on the path, ahead of whatever the job installed, and its dependencies are the
job's own (the environment the gate already runs in). A commit whose install fails is not
judged: it is skipped, with pip's last words as the reason.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

INSTALLS = ("path", "pip")
PIP_TIMEOUT_S = 600.0


class Unrunnable(Exception):
    """The commit could not be installed: why, in one line."""


@dataclass(frozen=True)
class Installed:
    paths: tuple[Path, ...]  # what goes first on PYTHONPATH
    seconds: float = 0.0

    def environment(self, base: dict[str, str]) -> dict[str, str]:
        """``base`` with the commit's paths ahead of any PYTHONPATH it had."""
        env = dict(base)
        before = env.get("PYTHONPATH")
        paths = [str(p) for p in self.paths] + ([before] if before else [])
        env["PYTHONPATH"] = os.pathsep.join(paths)
        return env


def source_root(worktree: Path) -> Path:
    """The folder a ``src`` layout's packages are in, else the worktree itself."""
    src = worktree / "src"
    if src.is_dir() and any(p.is_dir() and (p / "__init__.py").exists() for p in src.iterdir()):
        return src
    return worktree


def install(worktree: Path, how: str, into: Path, *, timeout: float = PIP_TIMEOUT_S) -> Installed:
    """The commit at ``worktree`` made importable; ``into``: a folder for ``pip``'s files."""
    if how == "path":
        return Installed((source_root(worktree),))

    start = time.monotonic()
    command = [
        sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation",
        "--no-input", "--disable-pip-version-check", "--quiet", "--target", str(into),
        str(worktree),
    ]  # fmt: skip
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise Unrunnable(f"pip install took longer than {timeout:g} s") from None
    if done.returncode != 0:
        lines = [line.strip() for line in done.stderr.splitlines() if line.strip()]
        useful = [line for line in lines if "error" in line.lower()] or lines
        raise Unrunnable(f"pip install failed: {(useful or ['(no message)'])[-1][:300]}")
    return Installed((into,), time.monotonic() - start)
