"""The job's container: the ``docker run`` command line, the inputs it carries, and the run.

Host-side (the runner), never imports torch. The container gets the GPU flags, ``--ipc=host``
(or ``--shm-size``), the workspace mounted, the host user's uid:gid, only an allowlist of
environment variables, a named cache volume, a label for cleanup and a timeout; inside, it
runs ``dlci run ...``.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dlci.action.image import say
from dlci.errors import DlciError

JOB_LABEL = "dlci.job"
CACHE_VOLUME = "dlci-cache"  # pip, torch hub, datasets: survives between jobs on one runner
CONTAINER_HOME = "/home/dlci"
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
VALUE_INPUTS = ("target", "tests", "pytest-args", "install", "min-gpu-util")
SWITCH_INPUTS = ("doctest", "coverage", "memorize", "doctor", "profile")
TRUE, FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off")


def run_command(
    *,
    image: str,
    name: str,
    job: str,
    workspace: Path,
    workdir: str,
    gpus: str,
    shm_size: str,
    env_names: Sequence[str],
    memory: str = "",
    environ: dict[str, str],
    inner: Sequence[str],
    uid: int,
    gid: int,
) -> list[str]:
    """The docker run command line (a function, so tests can check every flag)."""
    rel = os.path.normpath(workdir or ".")
    if rel.startswith("..") or os.path.isabs(rel):
        raise DlciError(
            f"working directory {workdir!r} is outside the workspace",
            hint="give a path relative to the repository root",
        )
    cmd = ["docker", "run", "--rm", "--init", "--name", name, "--label", f"{JOB_LABEL}={job}"]
    cmd += ["--user", f"{uid}:{gid}"]
    cmd += ["--shm-size", shm_size] if shm_size else ["--ipc=host"]
    if memory:
        cmd += ["--memory", memory, "--memory-swap", memory]  # no swap: a clean OOM kill
    if gpus and gpus != "none":
        cmd += ["--gpus", gpus, "-e", "NVIDIA_DRIVER_CAPABILITIES=compute,utility"]
    cmd += ["-v", f"{workspace.resolve()}:{WORKSPACE}"]
    cmd += ["-v", f"{CACHE_VOLUME}:{CONTAINER_HOME}/.cache"]
    cmd += ["-w", f"{WORKSPACE}/{rel}" if rel != "." else WORKSPACE]
    for key in (*ENV_ALLOWLIST, *env_names):
        if key in environ:
            cmd += ["-e", key]  # the value comes from docker's own environment, not argv
    cmd += ["-e", "DLCI_IN_CONTAINER=1", image, *inner]
    return cmd


def inputs_to_argv(environ: dict[str, str]) -> list[str]:
    """``dlci run`` arguments from the action's inputs, passed as DLCI_INPUT_* variables.

    >>> inputs_to_argv({"DLCI_INPUT_TARGET": "pkg.m:f", "DLCI_INPUT_DOCTEST": "false"})
    ['--target', 'pkg.m:f', '--no-doctest']
    """
    argv: list[str] = []
    for name in VALUE_INPUTS:
        value = environ.get("DLCI_INPUT_" + name.upper().replace("-", "_"), "")
        if value.strip():
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


# ---------------------------------------------------------------------------- the run


@dataclass(frozen=True)
class RunRequest:
    """What ``dlci container run`` was asked for."""

    image: str
    workspace: str = "."
    workdir: str = "."
    gpus: str = "auto"
    shm_size: str = ""
    env: Sequence[str] = ()
    job: str = ""
    timeout_minutes: float = 60.0
    memory: str = ""
    gpu_found: str = ""
    inner: Sequence[str] = ()  # the arguments of dlci run


def run(request: RunRequest) -> int:
    """Run ``dlci run`` in the container; its exit code (125: docker could not start it)."""
    check_env_names(request.env)
    gpus = request.gpus
    if gpus == "auto":
        gpus = "all" if request.gpu_found == "true" else "none"
    job = request.job or f"local-{os.getpid()}"
    name = f"dlci-{job}"[:120]
    workspace = Path(request.workspace)
    if not workspace.is_dir():
        raise DlciError(f"{workspace}: the workspace is not a directory")
    environ = dict(os.environ)
    cmd = run_command(
        image=request.image,
        name=name,
        job=job,
        workspace=workspace,
        workdir=request.workdir,
        gpus=gpus,
        shm_size=request.shm_size,
        env_names=request.env,
        memory=request.memory,
        environ=environ,
        inner=["dlci", "run", *inputs_to_argv(environ), *request.inner],
        uid=os.getuid(),
        gid=os.getgid(),
    )
    say(shlex.join(cmd))
    code, stderr_tail = _watch(cmd, name, request.timeout_minutes)
    if code == 125:  # docker itself failed to start the container
        raise _start_failure(stderr_tail)
    if code in (137, 143):
        say(f"{name} was killed (exit code {code})")
    return code


def _kill(name: str) -> None:
    subprocess.run(["docker", "kill", name], capture_output=True, check=False, timeout=30)


def _watch(cmd: list[str], name: str, timeout_minutes: float) -> tuple[int, list[str]]:
    """Run the container, its stderr streamed through; SIGTERM and the timeout kill it."""
    child = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, errors="replace")

    def stop(signum: int, frame: Any) -> None:
        _kill(name)

    previous = signal.signal(signal.SIGTERM, stop)
    stderr_tail: list[str] = []

    def pump() -> None:
        assert child.stderr is not None
        for line in child.stderr:
            sys.stderr.write(line)
            stderr_tail.append(line)
            del stderr_tail[:-50]

    deadline = time.monotonic() + timeout_minutes * 60
    try:
        thread = threading.Thread(target=pump, daemon=True)
        thread.start()
        while child.poll() is None:
            if time.monotonic() > deadline:
                _kill(name)
                child.wait(30)
                raise DlciError(
                    f"the container ran past timeout-minutes ({timeout_minutes:g}) and "
                    "was stopped; the reports written before are in the artifacts",
                    hint="raise timeout-minutes, or lower the tier's caps",
                )
            time.sleep(0.2)
        thread.join(5)
    except KeyboardInterrupt:
        _kill(name)
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)
    return child.returncode, stderr_tail


def _start_failure(stderr_tail: list[str]) -> DlciError:
    from dlci.action.preflight import explain_docker_run_failure

    known = explain_docker_run_failure("".join(stderr_tail))
    if known is not None:
        return known
    return DlciError(
        "docker run could not start the container: " + "".join(stderr_tail[-3:]).strip()
    )
