"""The bundled example's own test suite (doctests, a memorization test through the plugin)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "digits"


def test_the_examples_own_tests_pass() -> None:
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", PYTHONPATH=str(EXAMPLE))
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--dlci-budget", "pr"],
        cwd=EXAMPLE,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:]
    assert "10 passed" in done.stdout
