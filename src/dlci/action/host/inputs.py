"""What enters the job's containers: the allowlisted variables and the action's inputs.

Host-side (the runner), never imports torch. Nothing else of the runner's environment enters a
container (no secrets, no tokens), and the inputs that become ``dlci run`` options arrive as
an argument list, never a shell string, so no input can inject a command.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from dlci.errors import DlciError

WORKSPACE = "/workspace"
# Variables that enter the container. Nothing else does: no secrets, no tokens.
ENV_ALLOWLIST = (
    "CI",
    "GITHUB_ACTIONS",
    "GITHUB_EVENT_NAME",
    "GITHUB_REF",
    "GITHUB_REF_NAME",
    "GITHUB_SHA",
    "GITHUB_REPOSITORY",
    "GITHUB_RUN_ID",
    "GITHUB_RUN_ATTEMPT",
    "GITHUB_JOB",
    "GITHUB_WORKFLOW",
    "RUNNER_OS",
    "RUNNER_ARCH",
    "DLCI_BUDGET",
    "DLCI_HARDWARE",
    "DLCI_LADDER",
    "DLCI_TARGET",
    "DLCI_TRACKER",
    "NVIDIA_VISIBLE_DEVICES",
    "CUDA_VISIBLE_DEVICES",
)
SECRET_HINTS = ("TOKEN", "SECRET", "PASSWORD", "KEY", "CREDENTIAL")

# Action inputs that become `dlci run` options: DLCI_INPUT_<NAME> on the host -> argv in the
# container (a list, never a shell string, so no input can inject a command).
VALUE_INPUTS = (
    "target", "tests", "pytest-args", "install", "min-gpu-util", "max-gpu-memory", "cpu-threads",
)  # fmt: skip
# inputs whose "auto" is dlci run's own default: not passed, so an image whose dl-ci predates
# the option still runs the job
DEFAULT_AUTO = ("cpu-threads",)
SWITCH_INPUTS = ("doctest", "coverage", "memorize", "doctor", "profile")
TRUE, FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off")


def inputs_to_argv(environ: dict[str, str]) -> list[str]:
    """``dlci run`` arguments from the action's inputs, passed as DLCI_INPUT_* variables.

    >>> inputs_to_argv({"DLCI_INPUT_TARGET": "pkg.m:f", "DLCI_INPUT_DOCTEST": "false"})
    ['--target', 'pkg.m:f', '--no-doctest']
    """
    argv: list[str] = []
    for name in VALUE_INPUTS:
        value = environ.get("DLCI_INPUT_" + name.upper().replace("-", "_"), "")
        if value.strip() and not (name in DEFAULT_AUTO and value.strip().lower() == "auto"):
            argv += [f"--{name}", value]
    ladder = environ.get("DLCI_INPUT_LADDER", "").strip()
    if ladder:
        rel = os.path.normpath(ladder)
        if rel.startswith("..") or os.path.isabs(rel):
            raise DlciError(
                f"input ladder {ladder!r} is outside the repository",
                hint="give a path relative to the repository root",
            )
        argv += ["--ladder", f"{WORKSPACE}/{rel}"]
    for name in SWITCH_INPUTS:
        value = environ.get("DLCI_INPUT_" + name.upper(), "").strip().lower()
        if value in FALSE:
            argv.append(f"--no-{name}")
        elif value and value not in TRUE:
            raise DlciError(
                f"input {name}: expected true or false, got {value!r}", hint=f"{name}: false"
            )
    return argv


def check_env_names(names: Sequence[str]) -> None:
    """Refuse an ``--env`` that is not a variable name, or that looks like a secret."""
    for name in names:
        if not name.replace("_", "").isalnum():
            raise DlciError(f"--env {name!r}: not a variable name")
        if any(word in name.upper() for word in SECRET_HINTS):
            raise DlciError(
                f"--env {name}: refusing to pass what looks like a secret into the container",
                hint="the container runs the pull request's code; keep secrets on the host",
            )
