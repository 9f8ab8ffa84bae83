"""After the job: remove its containers, give the workspace back, find GPU memory left in use.

Host-side (the runner), never imports torch. A self-hosted runner is reused by the next job,
so what this job leaves behind (a stuck container, files owned by another user, a process
holding GPU memory) is found and undone here, and recorded in ``cleanup.json``.

No code that the pull request controls runs as root here: the job's image may be built from
a Dockerfile the pull request edits, so it is never used to give files back. Ownership is
restored by ``os.lchown`` when the runner runs as root, else by ``chown`` in the image the
runner's admin names in ``DLCI_CLEANUP_IMAGE`` (the runner's environment, never an input),
else the files are reported and left.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from pathlib import Path

from dlci.action.host.container import JOB_LABEL
from dlci.action.host.image import docker
from dlci.action.host.installed import remove_job_images
from dlci.hardware import pinned_gpus
from dlci.report.fields import Cleanup, GpuProcess

#: the runner's environment variable naming a trusted image with ``chown`` (docs/runner.md)
CLEANUP_IMAGE_ENV = "DLCI_CLEANUP_IMAGE"
#: how many of the files left to another user the report names
SAMPLE = 5
#: what `dlci container cleanup --image` prints: the option is accepted and ignored
IMAGE_IGNORED = (
    "note: --image is no longer used by cleanup: the job's image is never run as root "
    f"(a trusted one comes from {CLEANUP_IMAGE_ENV} in the runner's environment, docs/runner.md)"
)


def cleanup(job: str, workspace: Path, cleanup_image: str | None = None) -> Cleanup:
    """Undo what the job left; the ``cleanup`` report.

    ``cleanup_image``: the trusted image to run ``chown`` in when the runner is not root;
    None reads ``DLCI_CLEANUP_IMAGE``. The job's own image is never used for this.
    """
    removed = remove_containers(job)
    images = remove_job_images(job) if job and shutil.which("docker") else []
    uid, gid = os.getuid(), os.getgid()
    foreign = foreign_files(workspace, uid)
    image = os.environ.get(CLEANUP_IMAGE_ENV, "") if cleanup_image is None else cleanup_image
    method = restore_ownership(foreign, workspace, image, uid, gid) if foreign else "none"
    left = foreign_files(workspace, uid) if foreign and method != "none" else foreign
    return Cleanup(
        job=job,
        containers_removed=len(removed),
        images_removed=len(images),  # the job's installed image, left by a killed job
        foreign_files=len(foreign),
        ownership_restored=len(foreign) - len(left),
        ownership_method=method,
        foreign_left=len(left),
        foreign_sample=[os.path.relpath(p, workspace) for p in left[:SAMPLE]],
        gpu_processes=gpu_processes(),
    )


def describe(report: Cleanup) -> tuple[str, list[str]]:
    """The line that sums up a cleanup report, and its warnings (files left, GPU memory).

    >>> describe(Cleanup(containers_removed=1, foreign_files=2, ownership_restored=2,
    ...                  gpu_processes=[GpuProcess(pid=7, used_memory_mib=512)]))[1]
    ['GPU memory still in use after the job: 512 MiB by 1 process(es)']
    """
    processes = report.gpu_processes
    line = (
        f"cleanup: {report.containers_removed} container(s) removed, "
        f"{report.foreign_files} file(s) owned by another user "
        f"({report.ownership_restored} restored), {len(processes)} GPU process(es) still running"
    )
    warnings = []
    left = report.foreign_left
    if left:
        sample = report.foreign_sample
        named = ", ".join(sample) + (", ..." if left > len(sample) else "")
        why = {
            "image": f"chown in {CLEANUP_IMAGE_ENV} did not give them back (is the image on "
            "the runner, with chown?)",
            "root": "lchown failed on them",
        }.get(
            report.ownership_method,
            f"to give them back, run the runner as root or set {CLEANUP_IMAGE_ENV} in the "
            "runner's environment to a trusted image with chown (docs/runner.md): the job's "
            "own image is never run as root",
        )
        warnings.append(
            f"{left} file(s) in the workspace are owned by another user and were left as they "
            f"are ({named}); {why}"
        )
    if processes:
        used = sum(p.used_memory_mib or 0 for p in processes)
        warnings.append(
            f"GPU memory still in use after the job: {used} MiB by {len(processes)} process(es)"
        )
    return line, warnings


def remove_containers(job: str) -> list[str]:
    """Force-remove the containers labelled with ``job``; their ids."""
    if not job or not shutil.which("docker"):
        return []
    listed = docker(["ps", "-aq", "--filter", f"label={JOB_LABEL}={job}"], timeout=60, check=False)
    ids = listed.stdout.split()
    if ids:
        docker(["rm", "-f", "-v", *ids], timeout=120, check=False)  # with anonymous volumes
    return ids


def restore_ownership(foreign: list[str], workspace: Path, image: str, uid: int, gid: int) -> str:
    """Give ``foreign`` files back to uid:gid; how: ``root``, ``image`` or ``none``.

    As root: ``os.lchown`` on the host, no container. Otherwise ``chown -R -h`` in ``image``,
    a trusted image the runner's admin named (never the job's), with no network and only the
    capabilities chown needs. Without either: ``none``, the files are left and reported.
    """
    if uid == 0:
        for path in foreign:
            with contextlib.suppress(OSError):
                os.lchown(path, uid, gid)
        return "root"
    if not image or not shutil.which("docker"):
        return "none"
    chown = ["run", "--rm", "--network", "none", "--user", "0:0", "--cap-drop", "ALL"]
    for cap in ("CHOWN", "DAC_OVERRIDE", "DAC_READ_SEARCH", "FOWNER"):
        chown += ["--cap-add", cap]
    chown += ["--security-opt", "no-new-privileges", "-v", f"{workspace.resolve()}:/w"]
    chown += ["--entrypoint", "chown", image, "-R", "-h", f"{uid}:{gid}", "/w"]
    docker(chown, timeout=600, check=False)
    return "image"


def foreign_files(workspace: Path, uid: int, limit: int = 100_000) -> list[str]:
    """Paths under ``workspace`` (outside .git) that another user owns, at most ``limit``."""
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


def gpu_processes(pinned: tuple[str, ...] | None = None) -> list[GpuProcess]:
    """The compute processes nvidia-smi lists, with their GPU memory; [] without nvidia-smi.

    On a runner pinned to some of the machine's GPUs (``pinned``; None reads
    ``DLCI_RUNNER_GPUS``), those on its own GPUs only: a neighbour runner's training on
    another GPU is not this job's leftover.
    """
    if pinned is None:
        pinned = pinned_gpus()
    if shutil.which("nvidia-smi") is None:
        return []
    query = "--query-compute-apps=gpu_uuid,pid,used_memory"
    try:
        done = subprocess.run(
            ["nvidia-smi", query, "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=15,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return [GpuProcess(error="nvidia-smi did not answer within 15 s (a wedged GPU?)")]
    own = {uuid.lower() for uuid in pinned}
    rows: list[GpuProcess] = []
    for line in done.stdout.strip().splitlines():
        parts = [x.strip() for x in line.split(",")]
        if len(parts) != 3 or not parts[1].isdigit():
            continue
        if own and parts[0].lower() not in own:
            continue  # another runner's GPU
        used = int(parts[2]) if parts[2].isdigit() else 0
        rows.append(GpuProcess(pid=int(parts[1]), used_memory_mib=used, gpu_uuid=parts[0]))
    return rows
