"""After the job: remove its containers, give the workspace back, find GPU memory left in use.

Host-side (the runner), never imports torch. A self-hosted runner is reused by the next job,
so what this job leaves behind (a stuck container, root-owned files, a process holding GPU
memory) is found and undone here, and recorded in ``cleanup.json``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

from dlci.action.container import JOB_LABEL
from dlci.action.image import docker


def cleanup(job: str, workspace: Path, image: str = "") -> dict[str, Any]:
    """Undo what the job left; the ``cleanup`` report (``image``: a shell to run chown in)."""
    removed = remove_containers(job)
    uid, gid = os.getuid(), os.getgid()
    foreign = foreign_files(workspace, uid)
    fixed = restore_ownership(foreign, workspace, image, uid, gid) if foreign else 0
    return {
        "schema_version": 1,
        "kind": "cleanup",
        "job": job,
        "containers_removed": len(removed),
        "foreign_files": len(foreign),
        "ownership_restored": fixed,
        "gpu_processes": gpu_processes(),
    }


def describe(report: dict[str, Any]) -> tuple[str, str | None]:
    """The line that sums up a cleanup report, and a warning when GPU memory is still in use.

    >>> describe({"containers_removed": 1, "foreign_files": 2, "ownership_restored": 2,
    ...           "gpu_processes": [{"pid": 7, "used_memory_mib": 512}]})[1]
    'GPU memory still in use after the job: 512 MiB by 1 process(es)'
    """
    processes = report["gpu_processes"]
    line = (
        f"cleanup: {report['containers_removed']} container(s) removed, "
        f"{report['foreign_files']} file(s) owned by another user "
        f"({report['ownership_restored']} restored), {len(processes)} GPU process(es) still running"
    )
    if not processes:
        return line, None
    used = sum(p.get("used_memory_mib", 0) for p in processes)
    return (
        line,
        f"GPU memory still in use after the job: {used} MiB by {len(processes)} process(es)",
    )


def remove_containers(job: str) -> list[str]:
    """Force-remove the containers labelled with ``job``; their ids."""
    if not job or not shutil.which("docker"):
        return []
    listed = docker(["ps", "-aq", "--filter", f"label={JOB_LABEL}={job}"], timeout=60, check=False)
    ids = listed.stdout.split()
    if ids:
        docker(["rm", "-f", *ids], timeout=120, check=False)
    return ids


def restore_ownership(foreign: list[str], workspace: Path, image: str, uid: int, gid: int) -> int:
    """Give ``foreign`` files back to uid:gid: directly as root, else by chown in ``image``."""
    if uid == 0:
        fixed = 0
        for path in foreign:
            try:
                os.lchown(path, uid, gid)
                fixed += 1
            except OSError:
                pass
        return fixed
    if not image or not shutil.which("docker"):
        return 0
    chown = ["run", "--rm", "--user", "0:0", "-v", f"{workspace.resolve()}:/w"]
    chown += ["--entrypoint", "chown", image, "-R", f"{uid}:{gid}", "/w"]
    done = docker(chown, timeout=600, check=False)
    return len(foreign) if done.returncode == 0 else 0


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


def gpu_processes() -> list[dict[str, Any]]:
    """The compute processes nvidia-smi lists, with their GPU memory; [] without nvidia-smi."""
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
    rows: list[dict[str, Any]] = []
    for line in done.stdout.strip().splitlines():
        parts = [x.strip() for x in line.split(",")]
        if len(parts) == 2 and parts[0].isdigit():
            used = int(parts[1]) if parts[1].isdigit() else 0
            rows.append({"pid": int(parts[0]), "used_memory_mib": used})
    return rows
