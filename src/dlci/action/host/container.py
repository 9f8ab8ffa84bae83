"""The job's container: the ``docker run`` command line, the inputs it carries, and the run.

Host-side (the runner), never imports torch. The container gets the GPU flags, its own IPC
namespace with a ``/dev/shm`` of ``--shm-size`` (``--ipc=host`` only when asked), the network
of the ``network`` input (dlci.action.host.network), the workspace mounted with git's credentials
hidden (dlci.action.host.gitview), the host user's uid:gid, no capabilities and no new privileges,
only an allowlist of environment variables (dlci.action.host.inputs), a cache volume chosen by
trust, a label for cleanup and a timeout; inside, it runs ``dlci run ...``.
"""

from __future__ import annotations

import functools
import os
import secrets
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dlci.action.host import installed, scratch
from dlci.action.host.cache import CACHE_PREFIX, UNTRUSTED, cache_mount, decide_trust
from dlci.action.host.gates import RECORD_VARIABLE, Parts
from dlci.action.host.gitview import hide_credentials, host_temp
from dlci.action.host.image import say
from dlci.action.host.inputs import ENV_ALLOWLIST, WORKSPACE, check_env_names, inputs_to_argv
from dlci.action.host.network import network_flags, resolve_network
from dlci.action.host.output import CHUNK, Output, explain_docker_run_failure
from dlci.errors import DlciError
from dlci.hardware import PIN_VARIABLE, pinned_gpus

JOB_LABEL = "dlci.job"
#: the runner a container's job ran on: the job-completed hook removes its own runner's only
RUNNER_LABEL = "dlci.runner"
SHM_SIZE = "2g"  # DataLoader workers pass tensors through /dev/shm; Docker gives 64 MB
IPC_MODES = ("private", "host")
PIDS_LIMIT = 32768  # a fork bomb stops here; DataLoader workers and threads stay far below
# A pull request's containers get less by default, so one cannot starve the runner for the
# next job (issue 35): 8192 processes and threads (16 DataLoader workers of 64 threads each
# use 1,100), and three quarters of the host's memory, with no swap.
UNTRUSTED_PIDS_LIMIT = 8192
UNTRUSTED_MEMORY_SHARE = 0.75


def pids_limit(trust: str) -> int:
    """The ``--pids-limit`` of a job's containers, by trust."""
    return UNTRUSTED_PIDS_LIMIT if trust == UNTRUSTED else PIDS_LIMIT


def default_memory(trust: str, meminfo: Path = Path("/proc/meminfo")) -> str:
    """The memory limit a job gets when the ``memory`` input is empty: none for a trusted
    job, three quarters of the host's memory (in MiB) for a pull request."""
    if trust != UNTRUSTED:
        return ""
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemTotal:"):
                kib = int(line.split()[1])
                return f"{int(kib * UNTRUSTED_MEMORY_SHARE) // 1024}m"
    except (OSError, ValueError, IndexError):
        pass
    return "8g"  # no /proc/meminfo to read: a bound all the same


def runner_name(environ: Mapping[str, str]) -> str:
    """The runner this job runs on: ``DLCI_RUNNER`` (setup.sh writes it in the runner's .env,
    where the job-completed hook reads it too), else GitHub's ``RUNNER_NAME``; '' unknown."""
    return environ.get("DLCI_RUNNER") or environ.get("RUNNER_NAME") or ""


def docker_gpus(value: str) -> str:
    """``--gpus`` as Docker reads it: a device list with a comma goes in double quotes (the
    flag is a CSV record: ``device=a,b`` unquoted is two fields, and ``b`` an unknown key).

    >>> docker_gpus("device=GPU-a,GPU-b"), docker_gpus("device=1"), docker_gpus("all")
    ('"device=GPU-a,GPU-b"', 'device=1', 'all')
    """
    if value.startswith("device=") and "," in value:
        return f'"{value}"'
    return value


def resolve_gpus(asked: str, gpu_found: bool, pinned: Sequence[str] = ()) -> str:
    """The ``--gpus`` value for the ``gpus`` input: ``auto`` is every GPU when one was found,
    else none. On a runner pinned to some of the machine's GPUs (``pinned``, their UUIDs from
    ``DLCI_RUNNER_GPUS``) the job gets those only: ``auto`` and ``all`` mean the runner's
    GPUs, ``device=N`` its N-th (or a pinned UUID); another runner's GPU is refused.

    >>> resolve_gpus("auto", True), resolve_gpus("auto", False)
    ('all', 'none')
    >>> pinned = ["GPU-a", "GPU-b"]
    >>> resolve_gpus("auto", True, pinned), resolve_gpus("device=1", True, pinned)
    ('device=GPU-a,GPU-b', 'device=GPU-b')
    """
    asked = (asked or "auto").strip()
    if not pinned:
        return ("all" if gpu_found else "none") if asked == "auto" else asked
    if asked == "none" or (asked == "auto" and not gpu_found):
        return "none"
    if asked in ("auto", "all"):
        return "device=" + ",".join(pinned)
    hint = (
        "gpus: auto (the runner's GPUs), none, or device=N with N from 0 to "
        f"{len(pinned) - 1} (the runner's N-th GPU); the machine's other GPUs belong to other "
        "runners (docs/runner.md)"
    )
    unquoted = asked.strip('"')
    if not unquoted.startswith("device="):
        raise DlciError(f"gpus {asked!r}: expected auto, all, none or device=...", hint=hint)
    chosen = []
    for entry in (e.strip() for e in unquoted.removeprefix("device=").split(",")):
        match = [
            uuid
            for i, uuid in enumerate(pinned)
            if (entry.isdigit() and int(entry) == i)
            or (entry.lower().startswith("gpu-") and uuid.lower().startswith(entry.lower()))
        ]
        if len(match) != 1:
            raise DlciError(
                f"gpus {asked!r}: this runner has {len(pinned)} GPU(s) of its own "
                f"({', '.join(pinned)}); {entry!r} is not one of them",
                hint=hint,
            )
        chosen.append(match[0])
    return "device=" + ",".join(dict.fromkeys(chosen))


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
    ipc: str = "private",
    network: str = "auto",
    trust: str = UNTRUSTED,
    cache_prefix: str = CACHE_PREFIX,
    created: int = 0,
    hidden_files: Sequence[tuple[Path, str]] = (),
    git_from: Path | None = None,
    runner: str = "",
    visible_devices: str = "",
) -> list[str]:
    """The docker run command line (a function, so tests can check every flag).

    ``workspace``: the folder mounted at /workspace (the job runs each part in a copy of the
    checkout: dlci.action.host.scratch); ``git_from``: the checkout whose ``.git`` is mounted
    read-only at /workspace/.git (default: ``workspace``'s own).
    ``hidden_files``: (host file, path relative to the workspace) mounted read-only over the
    workspace's own file (the sanitised git config of dlci.action.host.gitview), on top of the
    workspace's ``.git`` mounted read-only of its own (``mv .git .gitx`` fails: EBUSY).
    ``runner``: the runner's name, a label the job-completed hook filters on;
    ``visible_devices``: a pinned runner's GPU UUIDs, set as the container's
    ``NVIDIA_VISIBLE_DEVICES`` (the job's own value, which the NVIDIA runtime would read
    too, is then never passed: it could name a neighbour's GPU).
    """
    rel = os.path.normpath(workdir or ".")
    if rel.startswith("..") or os.path.isabs(rel):
        raise DlciError(
            f"working directory {workdir!r} is outside the workspace",
            hint="give a path relative to the repository root",
        )
    if ipc not in IPC_MODES:
        raise DlciError(f"ipc {ipc!r}: expected private or host", hint="ipc: private")
    cmd = ["docker", "run", "--rm", "--init", "--name", name, "--label", f"{JOB_LABEL}={job}"]
    if runner:
        cmd += ["--label", f"{RUNNER_LABEL}={runner}"]
    cmd += ["--user", f"{uid}:{gid}"]
    cmd += ["--security-opt", "no-new-privileges", "--cap-drop", "ALL"]
    cmd += ["--pids-limit", str(pids_limit(trust)), *network_flags(network, trust)]
    cmd += (
        ["--ipc=host"] if ipc == "host" else ["--ipc=private", "--shm-size", shm_size or SHM_SIZE]
    )
    if memory:
        cmd += ["--memory", memory, "--memory-swap", memory]  # no swap: a clean OOM kill
    if gpus and gpus != "none":
        cmd += ["--gpus", docker_gpus(gpus), "-e", "NVIDIA_DRIVER_CAPABILITIES=compute,utility"]
    if visible_devices:
        cmd += ["-e", f"NVIDIA_VISIBLE_DEVICES={visible_devices}"]
    cmd += ["-v", f"{workspace.resolve()}:{WORKSPACE}"]
    git = (git_from or workspace) / ".git"
    if git.is_dir() and not git.is_symlink():  # a mount point: no container renames or edits it
        cmd += ["-v", f"{git.resolve()}:{WORKSPACE}/.git:ro"]
    for host, inside in hidden_files:
        cmd += ["-v", f"{host}:{WORKSPACE}/{inside}:ro"]
    cmd += ["--mount", cache_mount(trust, cache_prefix, created)]
    cmd += ["-w", f"{WORKSPACE}/{rel}" if rel != "." else WORKSPACE]
    for key in (*ENV_ALLOWLIST, *env_names):
        if key == "NVIDIA_VISIBLE_DEVICES" and visible_devices:
            continue
        if key in environ:
            cmd += ["-e", key]  # the value comes from docker's own environment, not argv
    cmd += ["-e", "DLCI_IN_CONTAINER=1", image, *inner]
    return cmd


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
    ipc: str = "private"  # or host
    network: str = "auto"  # default or none; auto: by trust (dlci.action.host.network)
    trust: str = ""  # trusted, untrusted; empty: from GITHUB_EVENT_NAME
    cache_volume: str = CACHE_PREFIX  # the volumes' prefix: <prefix>-trusted, <prefix>-untrusted


def run(request: RunRequest) -> int:
    """Run the job's parts (dlci.action.host.gates), each ``dlci run --phase ...`` in its own
    container; the first bad exit code (125: docker could not start one)."""
    check_env_names(request.env)
    network_flags(request.network)  # a bad input fails here, before any container starts
    gpus, visible = job_gpus(request.gpus, request.gpu_found)
    job = request.job or f"local-{os.getpid()}"
    name = f"dlci-{job}"[:120]
    workspace = Path(request.workspace)
    if not workspace.is_dir():
        raise DlciError(f"{workspace}: the workspace is not a directory")
    environ = dict(os.environ)
    trust = decide_trust(request.trust, environ)
    say(f"cache: volume {request.cache_volume}-{trust} ({trust} job)")
    memory = request.memory or default_memory(trust)
    network = resolve_network(request.network, trust)
    say(f"limits: network {network}, memory {memory or 'unlimited'}, {pids_limit(trust)} pids")
    inner = [*inputs_to_argv(environ), *request.inner]
    parts = Parts(inner, workspace, request.workdir, environ.get(RECORD_VARIABLE, ""))
    try:
        with host_temp(environ) as tmp:
            hidden = hide_credentials(workspace, Path(tmp))
            pins = {rel: _identity(workspace / rel) for _, rel in hidden}
            build = functools.partial(
                run_command,
                image=request.image,
                job=job,
                workspace=workspace,
                workdir=request.workdir,
                gpus=gpus,
                shm_size=request.shm_size,
                env_names=request.env,
                memory=memory,
                environ=environ,
                uid=os.getuid(),
                gid=os.getgid(),
                ipc=request.ipc,
                network=request.network,
                trust=trust,
                cache_prefix=request.cache_volume,
                created=int(time.time()),
                hidden_files=hidden,
                runner=runner_name(environ),
                visible_devices=visible,
            )
            check = functools.partial(check_hidden, workspace, pins)
            copies = Copies(workspace, Path(tmp), [rel for _, rel in hidden])
            return _run_parts(parts, build, name, request.timeout_minutes, check, copies)
    finally:
        parts.close()


def job_gpus(asked: str, gpu_found: str) -> tuple[str, str]:
    """``--gpus`` for the ``gpus`` input on this runner, and the NVIDIA_VISIBLE_DEVICES a
    pinned runner sets itself ('' unpinned; "void": no GPU)."""
    pinned = pinned_gpus()
    gpus = resolve_gpus(asked, gpu_found == "true", pinned)
    visible = ""
    if pinned:
        visible = gpus.removeprefix("device=") if gpus != "none" else "void"
        say(f"gpus: this runner's own {len(pinned)} GPU(s) ({PIN_VARIABLE}): {gpus}")
    return gpus, visible


def _identity(path: Path) -> tuple[int, int] | None:
    info = os.lstat(path) if os.path.lexists(path) else None
    return (info.st_dev, info.st_ino) if info else None


def check_hidden(workspace: Path, pins: dict[str, tuple[int, int] | None]) -> None:
    """Fail closed unless each covered file is still the one covered (an earlier container
    could have moved ``.git`` away, its real config out from under the cover)."""
    for rel, identity in pins.items():
        if _identity(workspace / rel) != identity:
            raise DlciError(
                f"{rel} was moved or replaced in the workspace by an earlier container: its "
                "credentials would no longer be hidden, so no further container runs",
                hint="the pull request's code tampered with the workspace's .git",
            )


@dataclass
class Copies:
    """Each part's own copy of the checkout (dlci.action.host.scratch): made before its
    container, checked for planted git files and removed after it."""

    workspace: Path
    folder: Path  # the host's folder for the job's mounts (under RUNNER_TEMP)
    hidden: Sequence[str] = ()  # what the git view covers: copied as empty files
    git: dict[str, str] | None = None  # the checkout's git files, read before any container
    checkout: tuple[int, int] = (0, 0)  # bytes and files of a copy of the checkout

    def make(self, part: str, source: Path | None = None) -> Path:
        """A fresh copy for ``part``: of the checkout, or of ``source`` (the installed copy)."""
        if self.git is None:
            self.git = scratch.git_files(self.workspace)
        copy = self.folder / f"workspace-{part}"
        scratch.remove_copy(copy)
        started = time.monotonic()
        try:
            notes = scratch.make_copy(source or self.workspace, copy, empty=self.hidden)
        except RecursionError:
            scratch.remove_copy(copy)
            raise DlciError(
                f"the checkout could not be copied for the {part} step's container: its "
                "folders are nested too deep",
                hint="a tree this deep is not a project's checkout",
            ) from None
        except OSError as exc:
            scratch.remove_copy(copy)
            raise DlciError(
                f"the checkout could not be copied for the {part} step's container: "
                f"{exc.filename or ''}: {exc.strerror or exc}",
                hint="every file of the checkout must be readable by the runner's user; "
                "the copy goes under RUNNER_TEMP, which needs room for one copy",
            ) from None
        took = time.monotonic() - started
        if source is None:
            self.checkout = (notes.bytes, notes.files)
        size = f"{notes.files} files, {notes.bytes >> 20} MiB"
        what = "the installed checkout" if source else "the checkout"
        say(f"{part}: runs on a copy of {what} ({size}, copied in {took:.1f} s)")
        for why in notes.left_out[:5]:
            say(f"{part}: not copied: {why}")
        return copy

    def planted(self, copy: Path) -> list[str]:
        """What the part's container planted in its copy for git on the host."""
        try:
            return scratch.planted(self.git or {}, copy)
        except DlciError as exc:
            return [exc.message]

    def done(self, part: str, copy: Path, *, keep: bool = False) -> list[str]:
        """What the part's container planted in its copy for git on the host; the copy gone
        (``keep``: the install's, the source of every later copy, removed after the last)."""
        found = self.planted(copy)
        if keep and not found:
            return found
        if not scratch.remove_copy(copy):
            say(f"{part}: its copy of the checkout could not be removed whole ({copy})")
        return found


def _run_parts(
    parts: Parts,
    build: Callable[..., list[str]],
    name: str,
    timeout_minutes: float,
    check: Callable[[], None] = lambda: None,
    copies: Copies | None = None,
) -> int:
    """The tests container, then one per gate, each on its own copy of the checkout; the
    host's record after the last one."""
    deadline = time.monotonic() + timeout_minutes * 60
    planned = parts.plan()
    worst = 0
    once = Once()  # the install container's image and copy (dlci.action.host.installed)
    try:
        for part in planned:
            if _blocked(parts, part):
                parts.blocked = "not run: the install step failed"
                break
            here = name if part.name == "tests" else f"{name}-{part.name}"
            check()
            code, cmd, started = -1, [], time.monotonic()
            copy = copies.make(part.name, once.copy) if copies else None
            timing = parts.timing.setdefault(part.name, {})
            timing["copy_s"] = round(time.monotonic() - started, 3)
            try:
                mounts: dict[str, Any] = (
                    {"workspace": copy, "git_from": parts.workspace} if copy else {}
                )
                if once.image:
                    mounts["image"] = once.image
                argv = [*part.argv, *(["--installed"] if once.image else [])]
                cmd = build(name=here, inner=["dlci", "run", *argv], **mounts)
                cmd[2:2] = part.flags  # after "docker run": the part's own mounts
                if part.name == "install":  # kept until committed (dlci.action.host.installed)
                    end = cmd.index("DLCI_IN_CONTAINER=1")  # docker's flags end here
                    cmd = [*[a for a in cmd[:end] if a != "--rm"], *cmd[end:]]
                    installed.remove_container(here)
                say(shlex.join(cmd))
                started = time.monotonic()
                code, tail = watch(cmd, here, timeout_minutes, deadline)
                timing["container_s"] = round(time.monotonic() - started, 3)
                if code == 125:  # docker itself failed to start the container
                    raise _start_failure(tail)
                older = part.name == "install" and code == 2 and _predates(tail)
                if older:
                    say("install: the image's dl-ci predates the install container (dlci run "
                        "--phase install): every part installs the project, as before; rebuild "
                        "the image to install once a job")  # fmt: skip
                    parts.timing.pop("install", None)
                else:
                    parts.collect(part, code, copy)
            finally:
                keep = part.name == "install" and code == 0 and parts.install_passed()
                found = copies.done(part.name, copy, keep=keep) if copies and copy else []
                if part.name == "install":
                    if keep and not found:
                        once.commit(here, cmd, copy, timing, copies)
                    installed.remove_container(here)
            if found:  # the copy is gone; the job fails, naming what git would have read
                shown = ", ".join(found[:5]) + (", ..." if len(found) > 5 else "")
                parts.planted.append(
                    f"the {part.name} step planted git files in its copy of the workspace "
                    f"({shown}): git on the host would read them and run what they configure; "
                    "discarded with the copy, never handed back"
                )
                worst = worst or 1
            if older:
                continue
            worst = worst or code
            if code in (137, 143):
                say(f"{here} was killed (exit code {code})")
                break
    finally:
        once.close(copies)
        parts.finish(planned)
    return worst


def _predates(tail: Sequence[str]) -> bool:
    """Whether a container's ``dlci run`` refused ``--phase install`` (an older image)."""
    return any("invalid choice: 'install'" in line for line in tail[-5:])


def _blocked(parts: Parts, part: Any) -> bool:
    """Whether the install step failed before this part (the tests part of a job without an
    install container runs the step itself)."""
    if part.name == "install" or (part.name == "tests" and "install" not in parts.exit_codes):
        return False
    return not parts.installed()


@dataclass
class Once:
    """The job's installed image and the install's copy of the checkout (the source of every
    later part's copy); nothing while the install container has not passed."""

    image: str | None = None
    copy: Path | None = None

    def commit(
        self,
        container: str,
        cmd: list[str],
        copy: Path | None,
        timing: dict[str, float],
        copies: Copies | None = None,
    ) -> None:
        job = next((v.partition("=")[2] for v in cmd if v.startswith(f"{JOB_LABEL}=")), "")
        why = ""
        if copy is not None and copies is not None:  # what the install wrote, before any copy
            size, count = copies.checkout
            why = scratch.measure(
                copy, limit_bytes=size + installed.GROWTH_BYTES,
                limit_files=count + installed.GROWTH_FILES,
            ) or ""  # fmt: skip
            why = f"its checkout: {why}" if why else ""
        image, took = None, 0.0
        if not why:
            image, took, why = installed.commit(container, job, cmd)
        timing["commit_s"] = round(took, 3)
        if image is None:
            say(f"install: the container could not be kept as an image ({why}): every part "
                "installs the project again")  # fmt: skip
            if copy is not None:
                scratch.remove_copy(copy)
            return
        say(f"install: kept as the image {image} in {took:.1f} s; every part starts from it")
        self.image, self.copy = image, copy

    def close(self, copies: Copies | None) -> None:
        installed.remove_image(self.image)
        mine = copies is not None and self.copy is not None and self.copy.parent == copies.folder
        if mine and self.copy is not None and not scratch.remove_copy(self.copy):
            say(f"install: its copy of the checkout could not be removed whole ({self.copy})")
        self.image = self.copy = None


def _kill(name: str) -> None:
    subprocess.run(["docker", "kill", name], capture_output=True, check=False, timeout=30)


def watch(
    cmd: list[str], name: str, timeout_minutes: float, deadline: float | None = None
) -> tuple[int, list[str]]:
    """Run the container, its output (stdout and stderr in order) streamed through between
    ``::stop-commands::TOKEN`` and ``::TOKEN::``: none of it is a workflow command. The token
    is made after the container started, so it is in nothing the container was given. The
    output is read in chunks and printed within the caps of :class:`Output`."""
    child = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    token = secrets.token_hex(16)
    print(f"::stop-commands::{token}", flush=True)

    def stop(signum: int, frame: Any) -> None:
        _kill(name)

    previous = signal.signal(signal.SIGTERM, stop)
    lock, closed = threading.Lock(), threading.Event()

    def write(text: str) -> None:
        sys.stdout.write(text)

    output = Output(write)

    def pump() -> None:
        assert child.stdout is not None
        fd = child.stdout.fileno()
        while chunk := os.read(fd, CHUNK):
            with lock:
                if closed.is_set():
                    continue  # never after the resume line: it would be read as a command
                output.feed(chunk)
                sys.stdout.flush()

    deadline = deadline or time.monotonic() + timeout_minutes * 60
    thread = threading.Thread(target=pump, daemon=True)
    try:
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
        thread.join(5)
        with lock:
            closed.set()
            dropped = output.close()
            # on a line of its own: after a last line without a newline, "x::TOKEN::" would
            # not resume, and every later step's workflow commands would stay stopped
            print(f"\n::{token}::", flush=True)
        if dropped:
            say(f"{name}: {dropped}")
    return child.returncode, output.tail


def _start_failure(stderr_tail: list[str]) -> DlciError:
    known = explain_docker_run_failure("".join(stderr_tail))
    if known is not None:
        return known
    return DlciError(
        "docker run could not start the container: " + "".join(stderr_tail[-3:]).strip()
    )
