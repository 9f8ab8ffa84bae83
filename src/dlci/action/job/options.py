"""``dlci run``'s options (JobOptions), completed from the configuration (dlci.config).

Runs in the container.

The trusted keys come from the host's snapshot in the job plan (``--plan``), never from the
pull request's working tree when there is one; the untrusted ones (test paths, pytest arguments)
from the project's file. Never imports torch.
"""

from __future__ import annotations

import dataclasses
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dlci.config import resolve


@dataclass(frozen=True)
class JobOptions:
    """What ``dlci run`` was asked to do."""

    out: Path
    budget: str = "auto"
    hardware: str = "auto"
    ladder: str | None = None
    target: str | None = None
    install: str = "auto"
    tests: str = ""
    pytest_args: str = ""
    doctest: bool = True
    coverage: bool = True
    memorize: bool = True
    doctor: bool = True
    profile: bool = True
    min_gpu_util: float | None = None
    max_gpu_memory: float | None = None  # percent of the device's memory
    plan: str | None = None  # the job plan's file (dlci.ladder.plan), the host's
    phase: str = "all"  # all, install, tests, or one gate
    cpu_threads: str = "auto"  # torch's and OpenMP's threads (dlci.action.job.threads)
    installed: bool = False  # the image already has the project installed (skip the step)
    allow_no_tests: bool = False  # pytest's exit code 5 (no tests collected) passes


def configured(options: JobOptions) -> JobOptions:
    """The options, with the configuration's values where ``dlci run`` was given none.

    The gates' values (min-gpu-util, max-gpu-memory) are trusted keys: with a plan they come
    from its ``config`` (the host's snapshot, from the base commit on a pull request); the
    tests' paths and pytest arguments from the project's file (dlci.config). The doctor reads
    its policy itself, from the same plan (its ``--plan``).
    """
    cli = {
        "min-gpu-util": options.min_gpu_util,
        "max-gpu-memory": options.max_gpu_memory,
        "tests": options.tests or None,
        "pytest-args": options.pytest_args or None,
    }
    config = resolve(cli, cwd=Path.cwd(), plan=options.plan)
    return dataclasses.replace(
        options,
        tests=_words(config.get("tests")),
        pytest_args=_words(config.get("pytest-args")),
        min_gpu_util=_percent(config.get("min-gpu-util")),
        max_gpu_memory=_percent(config.get("max-gpu-memory")),
    )


def _words(value: Any) -> str:
    """A list of words (the configuration's) or a string (an option's) as one shell string.

    >>> _words(["tests/a b.py", "-x"]), _words("-m 'not slow'"), _words(None)
    ("'tests/a b.py' -x", "-m 'not slow'", '')
    """
    if isinstance(value, list | tuple):
        return shlex.join(str(word) for word in value)
    return str(value) if value else ""


def _percent(value: Any) -> float | None:
    return None if value is None or isinstance(value, bool) else float(value)
