"""The baseline of a comparison: another run's dl-ci reports, fetched through GitHub's API.

``auto`` is the newest successful run of this workflow on the pull request's base branch
(``$GITHUB_BASE_REF``; on other events this run's own branch), never this run itself; a
number is that run. Of the run's artifacts, the newest unexpired one named
``<artifact-name>-<hardware class>-...`` is downloaded (the action names its uploads so).

The archive is outside input: it is downloaded to a temporary file under a size cap, and only
the few reports the comparison reads are taken from its top level, each read through a cap
(a zip bomb expands no further than that) and written under its own fixed name (a member's
path is never used as a path: no zip slip). Nothing here fails a job: every problem is a
reason in :class:`Fetched`, which the caller shows as a warning and "no baseline".
"""

from __future__ import annotations

import os
import re
import struct
import tempfile
import urllib.parse
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dlci.action.github_api import ApiError, GitHub

REPORTS = ("utilization.json", "memorization.json", "preflight.json", "coverage.xml")
MAX_ARCHIVE = 512 << 20  # bytes of the artifact's zip
MAX_MEMBER = 64 << 20  # bytes of one report, decompressed
MAX_ENTRIES = 20_000  # members of the zip
MAX_DIRECTORY = 16 << 20  # bytes of its central directory (what zipfile parses into memory)
MAX_PAGES = 10  # pages of 100 artifacts
WORKFLOW_REF = re.compile(r"^[^/]+/[^/]+/\.github/workflows/([^@/]+)@")


@dataclass
class Fetched:
    """What was fetched: the folder of reports, or why there is none."""

    folder: Path | None = None
    run: dict[str, Any] = field(default_factory=dict)  # id, head_sha, created_at, html_url
    artifact: str = ""
    problem: str = ""
    skipped: list[str] = field(default_factory=list)  # reports left out, with the reason


def workflow_file(environ: dict[str, str] | os._Environ[str]) -> str | None:
    """This run's workflow file name, from ``$GITHUB_WORKFLOW_REF``.

    >>> workflow_file({"GITHUB_WORKFLOW_REF": "org/app/.github/workflows/pr.yml@refs/pull/3/merge"})
    'pr.yml'
    """
    match = WORKFLOW_REF.match(environ.get("GITHUB_WORKFLOW_REF", ""))
    return match.group(1) if match else None


def base_branch(environ: dict[str, str] | os._Environ[str]) -> str | None:
    """The pull request's base branch; on other events, this run's own branch."""
    return environ.get("GITHUB_BASE_REF") or environ.get("GITHUB_REF_NAME") or None


def find_run(
    api: GitHub,
    spec: str,
    *,
    workflow: str | None,
    branch: str | None,
    status: str = "success",
) -> dict[str, Any]:
    """The baseline run: ``auto`` or a run id (raises ApiError when there is none).

    ``status``: ``success`` (the default), or ``completed`` for any finished run."""
    if spec.isdigit():
        run = api.get(f"/repos/{{repo}}/actions/runs/{int(spec)}")
        if not isinstance(run, dict) or not isinstance(run.get("id"), int):
            raise ApiError(f"run {spec}: the answer has no run id")
        return run
    if not workflow or not branch:
        raise ApiError("baseline auto needs GITHUB_WORKFLOW_REF and a branch (GITHUB_BASE_REF)")
    answer = api.get(
        f"/repos/{{repo}}/actions/workflows/{urllib.parse.quote(workflow, safe='')}/runs",
        branch=branch,
        status=status,
        per_page=20,
    )
    runs = answer.get("workflow_runs") if isinstance(answer, dict) else None
    this_run = os.environ.get("GITHUB_RUN_ID", "")
    for run in runs if isinstance(runs, list) else []:
        if (
            isinstance(run, dict)
            and isinstance(run.get("id"), int)
            and (run.get("conclusion") == "success" or status == "completed")
            and str(run["id"]) != this_run
            and run.get("head_branch") == branch
        ):
            return run
    which = "successful" if status == "success" else "finished"
    raise ApiError(f"no {which} run of {workflow} on {branch} yet")


def find_artifact(api: GitHub, run_id: int, prefix: str) -> dict[str, Any]:
    """The run's newest unexpired artifact whose name starts with ``prefix``."""
    found: list[dict[str, Any]] = []
    for page in range(1, MAX_PAGES + 1):
        answer = api.get(
            f"/repos/{{repo}}/actions/runs/{run_id}/artifacts", per_page=100, page=page
        )
        artifacts = answer.get("artifacts") if isinstance(answer, dict) else None
        if not isinstance(artifacts, list):
            raise ApiError(f"run {run_id}: the answer has no artifact list")
        found += [
            a
            for a in artifacts
            if isinstance(a, dict)
            and isinstance(a.get("id"), int)
            and str(a.get("name", "")).startswith(prefix)
            and a.get("expired") is False
        ]
        if len(artifacts) < 100:
            break
    if not found:
        raise ApiError(f"run {run_id} kept no unexpired artifact named {prefix}*")
    return max(found, key=lambda a: (str(a.get("created_at") or ""), a["id"]))


def extract(archive: Path, into: Path, names: tuple[str, ...] = REPORTS) -> list[str]:
    """Copy ``names`` at the archive's top level into ``into``; what was left out, and why."""
    skipped = []
    count, directory = directory_size(archive)
    if count > MAX_ENTRIES or directory > MAX_DIRECTORY:
        raise ApiError(f"the artifact holds more than {MAX_ENTRIES} files")
    with zipfile.ZipFile(archive) as zipped:
        members = zipped.infolist()
        if len(members) > MAX_ENTRIES:
            raise ApiError(f"the artifact holds more than {MAX_ENTRIES} files")
        by_name: dict[str, list[zipfile.ZipInfo]] = {}
        for info in members:
            by_name.setdefault(info.filename, []).append(info)
        into.mkdir(parents=True, exist_ok=True)
        for name in names:
            entries = by_name.get(name, [])
            why = _refused(entries)
            if why:
                if entries:
                    skipped.append(f"{name}: {why}")
                continue
            data = _read_capped(zipped, entries[0])
            if data is None:
                skipped.append(f"{name}: larger than {MAX_MEMBER >> 20} MiB decompressed")
                continue
            (into / name).write_bytes(data)
    return skipped


def directory_size(archive: Path) -> tuple[int, int]:
    """The member count and central directory size the zip's end record claims, read before
    zipfile parses the directory (whose every entry it keeps in memory)."""
    size = archive.stat().st_size
    with open(archive, "rb") as handle:
        handle.seek(max(0, size - (22 + 0xFFFF)))
        tail = handle.read()
        at = tail.rfind(b"PK\x05\x06")
        if at < 0 or len(tail) - at < 22:
            raise zipfile.BadZipFile("no end of central directory")
        entries, directory = struct.unpack("<HI", tail[at + 10 : at + 16])
        if entries != 0xFFFF and directory != 0xFFFFFFFF:
            return entries, directory
        locator = tail.rfind(b"PK\x06\x07", 0, at)  # zip64: the record it points at
        if locator < 0 or at - locator < 20:
            raise zipfile.BadZipFile("a zip64 end record without its locator")
        (offset,) = struct.unpack("<Q", tail[locator + 8 : locator + 16])
        handle.seek(min(offset, size))
        record = handle.read(56)
    if len(record) < 56 or record[:4] != b"PK\x06\x06":
        raise zipfile.BadZipFile("a broken zip64 end record")
    entries64, directory64 = struct.unpack("<QQ", record[32:48])
    return int(entries64), int(directory64)


def _refused(entries: list[zipfile.ZipInfo]) -> str:
    if not entries:
        return "missing"
    if len(entries) > 1:
        return "more than one member has this name"
    info = entries[0]
    if info.is_dir() or info.flag_bits & 0x1:
        return "not a plain file (a folder or encrypted)"
    if info.file_size > MAX_MEMBER:
        return f"larger than {MAX_MEMBER >> 20} MiB decompressed"
    return ""


def _read_capped(zipped: zipfile.ZipFile, info: zipfile.ZipInfo) -> bytes | None:
    """The member's bytes, or None past MAX_MEMBER whatever its header claims."""
    chunks, size = [], 0
    with zipped.open(info) as member:
        while chunk := member.read(1 << 20):
            size += len(chunk)
            if size > MAX_MEMBER:
                return None
            chunks.append(chunk)
    return b"".join(chunks)


def fetch(
    api: GitHub,
    spec: str,
    *,
    prefix: str,
    into: Path,
    names: tuple[str, ...] = REPORTS,
    status: str = "success",
    environ: dict[str, str] | os._Environ[str] = os.environ,
) -> Fetched:
    """``names`` from the baseline's artifact in ``into``, or the reason there are none (never
    raises). ``status``: which runs count (:func:`find_run`)."""
    out = Fetched()
    try:
        workflow, branch = workflow_file(environ), base_branch(environ)
        run = find_run(api, spec, workflow=workflow, branch=branch, status=status)
        out.run = {
            k: run.get(k) for k in ("id", "head_sha", "head_branch", "created_at", "html_url")
        }
        artifact = find_artifact(api, run["id"], prefix)
        out.artifact = str(artifact.get("name", ""))[:200]
        size = artifact.get("size_in_bytes")
        if isinstance(size, int) and size > MAX_ARCHIVE:
            raise ApiError(f"artifact {out.artifact} is larger than {MAX_ARCHIVE >> 20} MiB")
        with tempfile.TemporaryDirectory(prefix="dlci-baseline-") as tmp:
            archive = Path(tmp) / "artifact.zip"
            api.download(
                f"/repos/{{repo}}/actions/artifacts/{artifact['id']}/zip",
                archive,
                limit=MAX_ARCHIVE,
            )
            out.skipped = extract(archive, into, names)
        out.folder = into
    except ApiError as exc:
        out.problem = str(exc)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError, NotImplementedError,
            RuntimeError, ValueError) as exc:  # fmt: skip
        out.problem = f"the artifact {out.artifact} is not a readable zip ({str(exc)[:200]})"
    return out
