"""``dlci container``: build or pull the job's image, run ``dlci run`` in it, clean up.

Host-side (the runner), never imports torch. Three subcommands:

- ``build``: ``docker build`` of a Dockerfile, tagged by a hash of its inputs (the Dockerfile,
  the build arguments and the files of the build context), skipped when that tag exists;
  or ``--image NAME``: use a prebuilt image, pulled when it is not there.
- ``run``: ``docker run`` with the GPU flags, ``--ipc=host`` (or ``--shm-size``), the
  workspace mounted, the host user's uid:gid, only an allowlist of environment variables,
  named cache volumes, a label for cleanup and a timeout; inside, ``dlci run ...``.
- ``cleanup``: remove the job's containers, give the workspace back to the runner's user,
  report GPU memory still in use. Writes OUT/cleanup.json.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from dlci.commands import _common
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
ALWAYS_IGNORED = (".git", ".venv", "dlci-artifacts", "__pycache__", ".pytest_cache", ".mypy_cache")


def main(argv: Sequence[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(
            "usage: dlci container {build,run,cleanup} ...\n\n"
            "Build or pull the job's image, run `dlci run` in it, clean up (host side).\n"
            "Run 'dlci container SUBCOMMAND --help' for its options."
        )
        return 0 if argv else 1
    sub, rest = argv[0], list(argv[1:])
    if sub == "build":
        return _build(rest)
    if sub == "run":
        return _run(rest)
    if sub == "cleanup":
        return _cleanup(rest)
    raise DlciError(f"dlci container: unknown subcommand {sub!r}", hint="use build, run or cleanup")


# ---------------------------------------------------------------------------- docker


def docker(
    args: list[str], *, timeout: float | None = None, check: bool = True
) -> subprocess.CompletedProcess[str]:
    if shutil.which("docker") is None:
        raise DlciError("the docker command is not installed", hint="run dlci preflight first")
    try:
        done = subprocess.run(
            ["docker", *args], capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired:
        raise DlciError(
            f"docker {args[0]} did not finish within {timeout:g} s",
            hint="check the Docker engine (systemctl status docker)",
        ) from None
    if check and done.returncode != 0:
        from dlci.action.preflight import explain_docker_run_failure

        known = explain_docker_run_failure(done.stderr)
        if known is not None:
            raise known
        last = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
        raise DlciError(f"docker {args[0]} failed: {last}")
    return done


def image_exists(image: str) -> bool:
    return docker(["image", "inspect", image], timeout=60, check=False).returncode == 0


# ---------------------------------------------------------------------------- build


def _ignore_patterns(context: Path) -> list[str]:
    path = context / ".dockerignore"
    patterns = list(ALWAYS_IGNORED)
    if path.is_file():
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            line = line.strip()
            if line and not line.startswith("#") and not line.startswith("!"):
                patterns.append(line.lstrip("/").rstrip("/"))
    return patterns


def _ignored(rel: str, patterns: list[str]) -> bool:
    parts = rel.split("/")
    for pattern in patterns:
        for i in range(1, len(parts) + 1):
            head = "/".join(parts[:i])
            if fnmatch.fnmatch(head, pattern) or fnmatch.fnmatch(parts[i - 1], pattern):
                return True
    return False


def _context_files(context: Path) -> Iterator[Path]:
    patterns = _ignore_patterns(context)
    for root, dirs, files in os.walk(context):
        rel_root = os.path.relpath(root, context)
        rel_root = "" if rel_root == "." else rel_root + "/"
        dirs[:] = sorted(d for d in dirs if not _ignored(rel_root + d, patterns))
        for name in sorted(files):
            if not _ignored(rel_root + name, patterns):
                yield Path(root) / name


def input_hash(dockerfile: Path, context: Path, build_args: dict[str, str]) -> str:
    """A hash of what the image is built from: same inputs, same tag, no rebuild."""
    digest = hashlib.sha256()
    digest.update(dockerfile.read_bytes())
    digest.update(json.dumps(build_args, sort_keys=True).encode())
    for path in _context_files(context):
        rel = path.relative_to(context).as_posix()
        digest.update(rel.encode() + b"\0")
        try:
            with open(path, "rb") as handle:
                for block in iter(lambda: handle.read(1 << 20), b""):
                    digest.update(block)
        except OSError:
            continue
    return digest.hexdigest()[:16]


def _build(argv: list[str]) -> int:
    p = _common.parser(
        "container build",
        "Provide the job's image: use --image (pulled if missing), or build --dockerfile "
        "with a tag that is a hash of its inputs, skipped when that image already exists.",
    )
    p.add_argument("--image", default="", help="a prebuilt image to use instead of building")
    p.add_argument("--dockerfile", default="", metavar="FILE", help="the Dockerfile to build")
    p.add_argument(
        "--context",
        default="",
        metavar="DIR",
        help="the build context (default: . for --dockerfile)",
    )
    p.add_argument(
        "--kit",
        default="",
        metavar="DIR",
        help="dl-ci's own folder: without --dockerfile, build its docker/Dockerfile there",
    )
    p.add_argument("--base-image", default="", metavar="IMAGE", help="--build-arg BASE_IMAGE")
    p.add_argument(
        "--build-arg", action="append", default=[], metavar="NAME=VALUE", help="more build args"
    )
    p.add_argument("--repository", default="dlci-local", help="the tag's repository name")
    p.add_argument("--timeout", type=float, default=3600.0, metavar="SECONDS")
    args = p.parse_args(argv)

    from dlci.report.github import write_outputs

    if args.image:
        if not image_exists(args.image):
            print(f"container: pulling {args.image}", file=sys.stderr, flush=True)
            docker(["pull", args.image], timeout=args.timeout)
        write_outputs({"image": args.image, "built": "false"})
        print(args.image)
        return 0
    if args.dockerfile:
        dockerfile, context = Path(args.dockerfile), Path(args.context or ".")
    elif args.kit:
        dockerfile, context = (
            Path(args.kit) / "docker" / "Dockerfile",
            Path(args.context or args.kit),
        )
    else:
        raise DlciError("give --image, --dockerfile or --kit", hint="dlci container build --help")
    if not dockerfile.is_file():
        raise DlciError(f"{dockerfile}: no such Dockerfile", hint="check the dockerfile input")
    if not context.is_dir():
        raise DlciError(f"{context}: the build context is not a directory")
    build_args: dict[str, str] = {}
    if args.base_image:
        build_args["BASE_IMAGE"] = args.base_image
    for item in args.build_arg:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise DlciError(f"--build-arg {item!r}: expected NAME=VALUE")
        build_args[name] = value
    start = time.perf_counter()
    tag = f"{args.repository}:{input_hash(dockerfile, context, build_args)}"
    hashed = time.perf_counter() - start
    if image_exists(tag):
        print(f"container: {tag} is up to date (inputs hashed in {hashed:.1f} s)", file=sys.stderr)
        write_outputs({"image": tag, "built": "false"})
        print(tag)
        return 0
    cmd = ["docker", "build", "-f", str(dockerfile), "-t", tag, "--label", "dlci.built=1"]
    for name, value in build_args.items():
        cmd += ["--build-arg", f"{name}={value}"]
    cmd.append(str(context))
    print(f"container: building {tag}: {' '.join(cmd)}", file=sys.stderr, flush=True)
    child = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace"
    )
    assert child.stdout is not None
    deadline = time.monotonic() + args.timeout
    for line in child.stdout:  # docker's progress, to our stderr (stdout carries the tag)
        sys.stderr.write(line)
        if time.monotonic() > deadline:
            child.kill()
            raise DlciError(f"docker build did not finish within {args.timeout:g} s")
    code = child.wait()
    if code != 0:
        raise DlciError(
            f"docker build of {dockerfile} failed (exit code {code}); its output is above",
            hint="fix the Dockerfile, or give a prebuilt image",
        )
    print(f"container: built {tag} in {time.perf_counter() - start:.1f} s", file=sys.stderr)
    write_outputs({"image": tag, "built": "true"})
    print(tag)
    return 0


# ---------------------------------------------------------------------------- run


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


# Action inputs that become `dlci run` options: DLCI_INPUT_<NAME> on the host -> argv in the
# container (a list, never a shell string, so no input can inject a command).
VALUE_INPUTS = ("target", "tests", "pytest-args", "install", "min-gpu-util")
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


def _run(argv: list[str]) -> int:
    p = _common.parser(
        "container run",
        "Run `dlci run ARGS...` in the image, with the workspace mounted. Everything after "
        "-- goes to dlci run.",
    )
    p.add_argument("--image", required=True)
    p.add_argument("--workspace", default=os.environ.get("GITHUB_WORKSPACE", "."), metavar="DIR")
    p.add_argument("--workdir", default=".", metavar="DIR", help="relative to the workspace")
    p.add_argument(
        "--gpus", default="auto", help="auto (all when a GPU was found), all, none, device=N"
    )
    p.add_argument(
        "--shm-size", default="", help="give the container this /dev/shm instead of --ipc=host"
    )
    p.add_argument(
        "--env", action="append", default=[], metavar="NAME", help="one more variable to pass in"
    )
    p.add_argument(
        "--job", default=os.environ.get("DLCI_JOB_ID", ""), help="the label value for cleanup"
    )
    p.add_argument("--timeout-minutes", type=float, default=60.0)
    p.add_argument(
        "--memory", default="", help="the container's memory limit (docker run --memory), e.g. 16g"
    )
    p.add_argument(
        "--gpu-found", default="", help="true/false from dlci preflight (for --gpus auto)"
    )
    p.add_argument("inner", nargs="*", metavar="-- ARGS", help="arguments of dlci run")
    args = p.parse_args(argv)

    for name in args.env:
        if not name.replace("_", "").isalnum():
            raise DlciError(f"--env {name!r}: not a variable name")
        if any(word in name.upper() for word in SECRET_HINTS):
            raise DlciError(
                f"--env {name}: refusing to pass what looks like a secret into the container",
                hint="the container runs the pull request's code; keep secrets on the host",
            )
    gpus = args.gpus
    if gpus == "auto":
        gpus = "all" if args.gpu_found == "true" else "none"
    job = args.job or f"local-{os.getpid()}"
    name = f"dlci-{job}"[:120]
    workspace = Path(args.workspace)
    if not workspace.is_dir():
        raise DlciError(f"{workspace}: the workspace is not a directory")
    cmd = run_command(
        image=args.image,
        name=name,
        job=job,
        workspace=workspace,
        workdir=args.workdir,
        gpus=gpus,
        shm_size=args.shm_size,
        env_names=args.env,
        memory=args.memory,
        environ=dict(os.environ),
        inner=["dlci", "run", *inputs_to_argv(dict(os.environ)), *args.inner],
        uid=os.getuid(),
        gid=os.getgid(),
    )
    print("container: " + " ".join(cmd), file=sys.stderr, flush=True)
    child = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, errors="replace")

    def stop(signum: int, frame: Any) -> None:
        subprocess.run(["docker", "kill", name], capture_output=True, check=False, timeout=30)

    previous = signal.signal(signal.SIGTERM, stop)
    stderr_tail: list[str] = []
    assert child.stderr is not None
    deadline = time.monotonic() + args.timeout_minutes * 60
    try:
        import threading

        def pump() -> None:
            assert child.stderr is not None
            for line in child.stderr:
                sys.stderr.write(line)
                stderr_tail.append(line)
                del stderr_tail[:-50]

        thread = threading.Thread(target=pump, daemon=True)
        thread.start()
        while child.poll() is None:
            if time.monotonic() > deadline:
                stop(signal.SIGTERM, None)
                child.wait(30)
                raise DlciError(
                    f"the container ran past timeout-minutes ({args.timeout_minutes:g}) and "
                    "was stopped; the reports written before are in the artifacts",
                    hint="raise timeout-minutes, or lower the tier's caps",
                )
            time.sleep(0.2)
        thread.join(5)
    except KeyboardInterrupt:
        stop(signal.SIGINT, None)
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)
    code = child.returncode
    if code == 125:  # docker itself failed to start the container
        from dlci.action.preflight import explain_docker_run_failure

        known = explain_docker_run_failure("".join(stderr_tail))
        if known is not None:
            raise known
        raise DlciError(
            "docker run could not start the container: " + "".join(stderr_tail[-3:]).strip()
        )
    if code in (137, 143):
        print(f"container: {name} was killed (exit code {code})", file=sys.stderr)
    return 0 if code == 0 else 1


# ---------------------------------------------------------------------------- cleanup


def _cleanup(argv: list[str]) -> int:
    p = _common.parser("container cleanup", "Remove the job's containers, restore ownership.")
    p.add_argument("--job", default=os.environ.get("DLCI_JOB_ID", ""))
    p.add_argument("--workspace", default=os.environ.get("GITHUB_WORKSPACE", "."), metavar="DIR")
    p.add_argument("--image", default="", help="an image with a shell, to restore ownership")
    p.add_argument("--out", default="dlci-artifacts", metavar="DIR")
    args = p.parse_args(argv)

    report: dict[str, Any] = {"schema_version": 1, "kind": "cleanup", "job": args.job}
    removed: list[str] = []
    if args.job and shutil.which("docker"):
        listed = docker(
            ["ps", "-aq", "--filter", f"label={JOB_LABEL}={args.job}"], timeout=60, check=False
        )
        ids = listed.stdout.split()
        if ids:
            docker(["rm", "-f", *ids], timeout=120, check=False)
            removed = ids
    report["containers_removed"] = len(removed)

    workspace = Path(args.workspace)
    uid, gid = os.getuid(), os.getgid()
    foreign = _foreign_files(workspace, uid)
    report["foreign_files"] = len(foreign)
    fixed = 0
    if foreign:
        if uid == 0:
            for path in foreign:
                try:
                    os.lchown(path, uid, gid)
                    fixed += 1
                except OSError:
                    pass
        elif args.image and shutil.which("docker"):
            done = docker(
                [
                    "run",
                    "--rm",
                    "--user",
                    "0:0",
                    "-v",
                    f"{workspace.resolve()}:/w",
                    "--entrypoint",
                    "chown",
                    args.image,
                    "-R",
                    f"{uid}:{gid}",
                    "/w",
                ],
                timeout=600,
                check=False,
            )
            fixed = len(foreign) if done.returncode == 0 else 0
    report["ownership_restored"] = fixed
    report["gpu_processes"] = _gpu_processes()
    _common.emit_json(report, str(Path(args.out) / "cleanup.json"))
    print(
        f"cleanup: {len(removed)} container(s) removed, {len(foreign)} file(s) owned by another "
        f"user ({fixed} restored), {len(report['gpu_processes'])} GPU process(es) still running",
        file=sys.stderr,
    )
    if report["gpu_processes"]:
        from dlci.report.console import print_warning

        used = sum(p.get("used_memory_mib", 0) for p in report["gpu_processes"])
        count = len(report["gpu_processes"])
        print_warning(f"GPU memory still in use after the job: {used} MiB by {count} process(es)")
    return 0


def _foreign_files(workspace: Path, uid: int, limit: int = 100_000) -> list[str]:
    found: list[str] = []
    if not workspace.is_dir():
        return found
    for root, dirs, files in os.walk(workspace):
        dirs[:] = [d for d in dirs if d != ".git"]
        for name in [*dirs, *files]:
            path = os.path.join(root, name)
            try:
                if os.lstat(path).st_uid != uid:
                    found.append(path)
            except OSError:
                continue
            if len(found) >= limit:
                return found
    return found


def _gpu_processes() -> list[dict[str, Any]]:
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        done = subprocess.run(
            ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=15,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return [{"error": "nvidia-smi did not answer within 15 s (a wedged GPU?)"}]
    rows = []
    for line in done.stdout.strip().splitlines():
        parts = [x.strip() for x in line.split(",")]
        if len(parts) == 2 and parts[0].isdigit():
            rows.append(
                {
                    "pid": int(parts[0]),
                    "used_memory_mib": int(parts[1]) if parts[1].isdigit() else 0,
                }
            )
    return rows
