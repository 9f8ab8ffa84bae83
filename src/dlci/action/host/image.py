"""The job's image: docker helpers, the build's inputs, pull or build.

Host-side (the runner), never imports torch. A built image is tagged by the trust level of
the job that built it and a hash of its inputs: the build arguments and the tar stream of the
build context, which the host assembles (dlci.action.host.archive: the Dockerfile and what Docker's
own .dockerignore rules send, never ``.git`` or the other always-ignored folders), so a
rebuild is skipped when that tag already exists, and an image a pull request built never
carries the tag a trusted job looks for. dl-ci's Dockerfile records where the image's torch
came from in /etc/dlci/torch.json; a build copies that file out (no code of the image runs)
into the image's labels ``dlci.torch.version``, ``dlci.torch.cuda`` and ``dlci.torch.source``.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import io
import os
import secrets
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dlci import jsonio
from dlci.action.host.archive import DOCKERFILE, context_hash, send_context
from dlci.action.host.cache import TRUSTED, UNTRUSTED, decide_trust
from dlci.action.host.network import build_network_flags
from dlci.action.host.output import CHUNK, Output, explain_docker_run_failure
from dlci.action.host.scratch import refuse_links
from dlci.errors import DlciError
from dlci.report.text import clean

TORCH_RECORD = "/etc/dlci/torch.json"  # written by docker/Dockerfile
TORCH_LABELS = {"version": "torch", "cuda": "cuda", "source": "source"}  # dlci.torch.<name>: key
_RECORD_MAX_BYTES = 64 << 10
OFFLINE_HINT = (
    "see the offline route in docs/container.md (a wheelhouse of wheels and PIP_OFFLINE=1: "
    "no index needed), or give a prebuilt image"
)


def say(message: str) -> None:
    """One progress line on stderr (stdout carries what a verb prints for the next step)."""
    print(f"container: {clean(message)}", file=sys.stderr, flush=True)


def docker(
    args: list[str], *, timeout: float | None = None, check: bool = True, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``docker ARGS``; with ``check``, a failure is a DlciError saying what went wrong."""
    if shutil.which("docker") is None:
        raise DlciError("the docker command is not installed", hint="run dlci preflight first")
    try:
        done = subprocess.run(
            ["docker", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            input=stdin,
        )
    except subprocess.TimeoutExpired:
        raise DlciError(
            f"docker {args[0]} did not finish within {timeout:g} s",
            hint="check the Docker engine (systemctl status docker)",
        ) from None
    if check and done.returncode != 0:
        known = explain_docker_run_failure(done.stderr)
        if known is not None:
            raise known
        last = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
        raise DlciError(f"docker {args[0]} failed: {last}")
    return done


def image_exists(image: str) -> bool:
    """Whether the engine has ``image`` locally."""
    return docker(["image", "inspect", image], timeout=60, check=False).returncode == 0


# ---------------------------------------------------------------------------- the inputs


def build_arguments(base_image: str, items: Sequence[str], **named: str) -> dict[str, str]:
    """``--build-arg`` values from ``NAME=VALUE`` items, BASE_IMAGE first when given; ``named``
    values (from options such as --extra-pip) last, and only when not empty.

    >>> build_arguments("python:3.12", ["A=1"], EXTRA_PIP="", PIP_INDEX_URL="https://m/simple")
    {'BASE_IMAGE': 'python:3.12', 'A': '1', 'PIP_INDEX_URL': 'https://m/simple'}
    """
    build_args: dict[str, str] = {}
    if base_image:
        build_args["BASE_IMAGE"] = base_image
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise DlciError(f"--build-arg {item!r}: expected NAME=VALUE")
        build_args[name] = value
    build_args.update({name: value for name, value in named.items() if value})
    return build_args


def build_sources(dockerfile: str, context: str, kit: str) -> tuple[Path, Path]:
    """The Dockerfile and the build context from the options, checked to exist."""
    if dockerfile:
        file, folder = Path(dockerfile), Path(context or ".")
    elif kit:
        file, folder = Path(kit) / "docker" / "Dockerfile", Path(context or kit)
    else:
        raise DlciError("give --image, --dockerfile or --kit", hint="dlci container build --help")
    if dockerfile:  # the pull request's paths: no link followed (a host file read through one
        refuse_links(file, "the Dockerfile")  # would land in the log in the builder's error)
        refuse_links(file.with_name(file.name + ".dockerignore"), "the Dockerfile's ignore file")
        refuse_links(folder / ".dockerignore", "the build context's .dockerignore")
    if not file.is_file():
        raise DlciError(f"{file}: no such Dockerfile", hint="check the dockerfile input")
    if not folder.is_dir():
        raise DlciError(f"{folder}: the build context is not a directory")
    return file, folder


# ---------------------------------------------------------------------------- provide


@dataclass(frozen=True)
class ImageRequest:
    """What ``dlci container build`` was asked for."""

    image: str = ""
    dockerfile: str = ""
    context: str = ""
    kit: str = ""
    base_image: str = ""
    build_arg: Sequence[str] = ()  # NAME=VALUE items
    extra_pip: str = ""  # EXTRA_PIP: more packages for the image, space-separated
    pip_index_url: str = ""  # PIP_INDEX_URL: a package index (a private mirror)
    repository: str = "dlci-local"
    timeout: float = 3600.0
    trust: str = "auto"  # the job's: auto decides it from the event (cache.decide_trust)
    network: str = "auto"  # the build's RUN steps: the job's network (dlci.action.host.network)


@dataclass(frozen=True)
class Image:
    """The image the job runs in, and whether this call built it."""

    tag: str
    built: bool


def provide(request: ImageRequest) -> Image:
    """The job's image: ``request.image`` (pulled when missing), or a build skipped when the
    tag of its input hash already exists."""
    if request.image:
        if not image_exists(request.image):
            say(f"pulling {request.image}")
            docker(["pull", request.image], timeout=request.timeout)
        return Image(request.image, built=False)
    dockerfile, context = build_sources(request.dockerfile, request.context, request.kit)
    build_args = build_arguments(
        request.base_image,
        request.build_arg,
        EXTRA_PIP=request.extra_pip,
        PIP_INDEX_URL=request.pip_index_url,
    )
    trust = decide_trust(request.trust, dict(os.environ))
    network = build_network_flags(request.network, trust)  # a bad input fails before the hash
    start = time.perf_counter()
    digest = context_hash(dockerfile, context, build_args)
    # A pull request's build is tagged untrusted-<hash>: no trusted job looks for that tag.
    # An untrusted job may reuse a trusted job's image of the same inputs (the safe way round).
    tags = [f"{request.repository}:{level}-{digest}" for level in (TRUSTED, UNTRUSTED)]
    # Jobs of other runners on this machine may build the same inputs now: one at a time,
    # and each looks again once it holds the lock (the first one's image is then there).
    with build_lock(digest, request.timeout):
        for tag in tags if trust == UNTRUSTED else tags[:1]:
            if image_exists(tag):
                took = time.perf_counter() - start
                say(f"{tag} is up to date (inputs hashed in {took:.1f} s, {trust} job)")
                say(describe_torch(torch_labels(tag)))
                return Image(tag, built=False)
        tag = tags[0] if trust == TRUSTED else tags[1]
        extra = ["--label", f"dlci.trust={trust}", *network]
        timeout = request.timeout
        build(dockerfile, context, tag, build_args, timeout=timeout, digest=digest, extra=extra)
        labels = label_torch(tag, read_torch_record(tag), timeout=request.timeout)
    say(f"built {tag} in {time.perf_counter() - start:.1f} s")
    say(describe_torch(labels))
    return Image(tag, built=True)


LOCK_DIR_ENV = "DLCI_LOCK_DIR"


@contextlib.contextmanager
def build_lock(digest: str, timeout: float) -> Iterator[None]:
    """Hold the machine's lock on building these inputs (a file lock under ``DLCI_LOCK_DIR``,
    default the temporary folder: shared by the runners of one machine, which run as one
    user); wait for another job's build of them, at most ``timeout`` seconds."""
    folder = Path(os.environ.get(LOCK_DIR_ENV) or tempfile.gettempdir()) / f"dlci-{os.getuid()}"
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    with open(folder / f"build-{digest[:32]}.lock", "w") as handle:
        deadline = time.monotonic() + timeout
        waited = False
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not waited:
                    say("another job on this machine is building the same inputs: waiting for it")
                    waited = True
                if time.monotonic() > deadline:
                    raise DlciError(
                        f"another job's build of the same inputs held the lock for {timeout:g} s",
                        hint="a stuck docker build on this machine: check docker ps and the "
                        "other runners' jobs",
                    ) from None
                time.sleep(1)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def build(
    dockerfile: Path,
    context: Path,
    tag: str,
    build_args: dict[str, str],
    *,
    timeout: float,
    digest: str = "",
    extra: Sequence[str] = (),
) -> None:
    """``docker build -`` of the context the host assembles (dlci.action.host.archive), its
    progress streamed to stderr, stopped after ``timeout`` seconds; with ``digest``, a stream
    that hashed otherwise (the context changed while it was sent) leaves no image."""
    cmd = ["docker", "build", "--force-rm", "-f", DOCKERFILE, "-t", tag]
    cmd += ["--label", "dlci.built=1", *extra]
    for name, value in build_args.items():
        cmd += ["--build-arg", f"{name}={value}"]
    cmd.append("-")
    say(f"building {tag} from {context} (the host's stream of it): {' '.join(cmd)}")
    child = subprocess.Popen(
        cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    assert child.stdout is not None
    sent: list[str] = []
    failed: list[BaseException] = []
    feed = functools.partial(_feed, child, dockerfile, context, build_args, sent, failed)
    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    deadline = time.monotonic() + timeout
    # docker's progress and the RUN steps' output (the Dockerfile's: the pull request's) to
    # our stderr (stdout carries the tag): read in chunks under caps, never a workflow command
    token = secrets.token_hex(16)
    print(f"::stop-commands::{token}", file=sys.stderr, flush=True)
    shown = Output(sys.stderr.write)
    try:
        while chunk := os.read(child.stdout.fileno(), CHUNK):
            shown.feed(chunk)
            sys.stderr.flush()
            if time.monotonic() > deadline:
                child.kill()
                raise DlciError(f"docker build did not finish within {timeout:g} s")
    finally:
        dropped = shown.close()
        print(f"\n::{token}::", file=sys.stderr, flush=True)
    if dropped:
        say(f"docker build: {dropped}")
    code = child.wait()
    feeder.join(60)
    if failed:
        docker(["image", "rm", "--force", tag], timeout=120, check=False)
        exc = failed[0]
        raise exc if isinstance(exc, DlciError) else DlciError(f"sending the build context: {exc}")
    if code != 0:
        raise DlciError(
            f"docker build of {dockerfile} failed (exit code {code}); its output is above",
            hint=f"fix the Dockerfile or its build arguments; where the runner cannot reach an "
            f"index: {OFFLINE_HINT}",
        )
    if digest and sent != [digest]:
        docker(["image", "rm", "--force", tag], timeout=120, check=False)
        raise DlciError(
            f"the build context changed while it was sent (hashed {digest}, sent "
            f"{sent[0] if sent else 'nothing'}): the image is removed",
            hint="nothing may write into the context while the image builds",
        )


def _feed(
    child: subprocess.Popen[bytes],
    dockerfile: Path,
    context: Path,
    build_args: dict[str, str],
    sent: list[str],
    failed: list[BaseException],
) -> None:
    """The build's stdin: the context stream (its hash into ``sent``; an error into
    ``failed``, and the build killed), then closed."""
    stdin = child.stdin
    assert stdin is not None
    try:
        sent.append(send_context(dockerfile, context, build_args, stdin.write))
    except BrokenPipeError:
        pass  # docker stopped reading: its own error follows
    except BaseException as exc:  # reported by build(), in the main thread
        failed.append(exc)
        child.kill()
    finally:
        with contextlib.suppress(OSError):
            stdin.close()


# ---------------------------------------------------------------------------- torch's origin


def read_torch_record(tag: str, *, timeout: float = 120.0) -> dict[str, Any] | None:
    """The image's /etc/dlci/torch.json, copied out of a created container that never starts
    (so no code of the image runs); None when the image has none (a Dockerfile of your own)."""
    created = docker(["create", "--network", "none", tag, "dlci-never-started"], timeout=timeout)
    container = created.stdout.strip()
    try:
        copied = subprocess.run(
            ["docker", "cp", f"{container}:{TORCH_RECORD}", "-"],
            capture_output=True,
            timeout=timeout,
            check=False,
        )
    finally:
        docker(["rm", "--force", container], timeout=timeout, check=False)
    if copied.returncode != 0:
        return None
    return parse_torch_record(copied.stdout)


def parse_torch_record(archive: bytes) -> dict[str, Any] | None:
    """The record from ``docker cp``'s tar stream: one regular file, small, a JSON object with
    a torch version; None for anything else."""
    try:
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            member = tar.next()
            if member is None or not member.isfile() or member.size > _RECORD_MAX_BYTES:
                return None
            handle = tar.extractfile(member)
            record = jsonio.decode(handle.read()) if handle is not None else None
    except (tarfile.TarError, ValueError):
        return None
    if not isinstance(record, dict) or not isinstance(record.get("torch"), str):
        return None
    return record


def label_torch(tag: str, record: dict[str, Any] | None, *, timeout: float) -> dict[str, str]:
    """Put the record into ``tag``'s labels: a build of ``FROM tag`` with docker's --label,
    its Dockerfile from stdin (no context). Returns the labels (none without a record)."""
    if record is None:
        return {}
    labels = {}
    for name, key in TORCH_LABELS.items():
        value = record.get(key)
        labels[f"dlci.torch.{name}"] = clean(str(value)) if value is not None else "none"
    args = ["build", "--force-rm", "-t", tag]
    for name, value in labels.items():
        args += ["--label", f"{name}={value}"]
    docker([*args, "-"], timeout=timeout, stdin=f"FROM {tag}\n")
    return labels


def torch_labels(tag: str) -> dict[str, str]:
    """The ``dlci.torch.*`` labels of a local image."""
    fmt = "{{json .Config.Labels}}"
    done = docker(["image", "inspect", "--format", fmt, tag], timeout=60, check=False)
    try:
        labels = jsonio.decode(done.stdout) if done.returncode == 0 else None
    except ValueError:
        labels = None
    if not isinstance(labels, dict):
        return {}
    return {k: str(v) for k, v in labels.items() if k.startswith("dlci.torch.")}


def describe_torch(labels: dict[str, str]) -> str:
    """One line about the image's torch, from its labels.

    >>> describe_torch({"dlci.torch.version": "2.5.1", "dlci.torch.cuda": "12.4",
    ...                 "dlci.torch.source": "base"}).split(": ")[0]
    "torch 2.5.1 (CUDA 12.4), the base image's"
    """
    if "dlci.torch.version" not in labels:
        return f"no torch labels (no {TORCH_RECORD} in the image: a Dockerfile of your own?)"
    cuda = labels.get("dlci.torch.cuda", "none")
    origin = "the base image's" if labels.get("dlci.torch.source") == "base" else "installed"
    names = (f"dlci.torch.{name}" for name in TORCH_LABELS)
    pairs = " ".join(f"{name}={labels[name]}" for name in names if name in labels)
    return f"torch {labels['dlci.torch.version']} (CUDA {cuda}), {origin}: {pairs}"
