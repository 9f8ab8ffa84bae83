"""The baseline of a comparison: another run's dl-ci reports, fetched through GitHub's API.

``auto`` is the newest successful run of this workflow on the pull request's base branch
(``$GITHUB_BASE_REF``; on other events this run's own branch) that the base branch made
itself: a push, schedule or workflow_dispatch run whose code is this repository's, never a
pull request's run (a fork's pull request from its own ``main`` has the head branch ``main``
too) and never this run itself. The newest such run that kept an artifact named
``<artifact-name>-<hardware class>-<job id>`` (the action names its uploads so) is the
baseline: runs without one are passed over, at most MAX_RUNS_TRIED of them. A number is that
run.

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
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dlci.action.github.api import ApiError, GitHub

REPORTS = ("utilization.json", "memorization.json", "preflight.json", "coverage.xml")
MAX_ARCHIVE = 512 << 20  # bytes of the artifact's zip
MAX_MEMBER = 64 << 20  # bytes of one report, decompressed
MAX_ENTRIES = 20_000  # members of the zip
MAX_DIRECTORY = 4 << 20  # bytes of its central directory (what zipfile parses into memory)
MAX_PAGES = 10  # pages of 100 artifacts
TRUSTED_EVENTS = ("push", "schedule", "workflow_dispatch")  # the base branch's own runs
RUNS_PER_PAGE = 100
MAX_RUN_PAGES = 3  # pages of runs looked through for ``auto``
MAX_RUNS_TRIED = 20  # newest trusted runs asked for their artifact before giving up
JOB_ID = re.compile(r"\d+-\d+-[0-9a-f]{8}")  # what follows the class in an upload's name
WORKFLOW_REF = re.compile(r"^[^/]+/[^/]+/\.github/workflows/([^@/]+)@")


@dataclass
class Fetched:
    """What was fetched: the folder of reports, or why there is none."""

    folder: Path | None = None
    run: dict[str, Any] = field(default_factory=dict)  # id, head_sha, created_at, html_url
    artifact: str = ""
    problem: str = ""
    skipped: list[str] = field(default_factory=list)  # reports left out, with the reason
    passed_over: list[int] = field(default_factory=list)  # newer runs that kept no artifact


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


def find_run(api: GitHub, spec: str) -> dict[str, Any]:
    """The run whose id is ``spec`` (raises ApiError when there is none)."""
    run = api.get(f"/repos/{{repo}}/actions/runs/{int(spec)}")
    if not isinstance(run, dict) or not isinstance(run.get("id"), int):
        raise ApiError(f"run {spec}: the answer has no run id")
    return run


def trusted(run: Any, api: GitHub, branch: str, status: str, this_run: str) -> bool:
    """Whether ``run`` is the base branch's own: a finished (``success``: successful) run of a
    TRUSTED_EVENTS event on ``branch`` whose code is this repository's, never this run.

    The API's branch filter matches a run's head branch, which a fork's pull request from its
    own ``main`` also has: the event and the head repository tell such a run apart."""
    if not isinstance(run, dict) or not isinstance(run.get("id"), int):
        return False
    return (
        run.get("status") == "completed"
        and (status == "completed" or run.get("conclusion") == "success")
        and str(run["id"]) != this_run
        and run.get("head_branch") == branch
        and run.get("event") in TRUSTED_EVENTS
        and _same_repo(run.get("head_repository"), api.repository)
        and _same_repo(run.get("repository"), api.repository)
    )


def _same_repo(repo: Any, name: str) -> bool:
    full = repo.get("full_name") if isinstance(repo, dict) else None
    return isinstance(full, str) and full.casefold() == name.casefold()  # GitHub ignores case


def candidate_runs(
    api: GitHub, *, workflow: str, branch: str, status: str, this_run: str
) -> Iterator[dict[str, Any]]:
    """The base branch's trusted runs of ``workflow``, newest first, from at most
    MAX_RUN_PAGES pages (asked lazily: the first page is often enough)."""
    path = f"/repos/{{repo}}/actions/workflows/{urllib.parse.quote(workflow, safe='')}/runs"
    for page in range(1, MAX_RUN_PAGES + 1):
        answer = api.get(path, branch=branch, status=status, per_page=RUNS_PER_PAGE, page=page)
        runs = answer.get("workflow_runs") if isinstance(answer, dict) else None
        if not isinstance(runs, list):
            raise ApiError(f"{workflow}: the answer has no list of runs")
        yield from (run for run in runs if trusted(run, api, branch, status, this_run))
        if len(runs) < RUNS_PER_PAGE:
            return


class NoArtifact(ApiError):
    """The run kept no artifact of the name asked for."""


def newest_with_artifact(
    api: GitHub,
    *,
    workflow: str | None,
    branch: str | None,
    status: str,
    prefix: str,
    rest: re.Pattern[str] | None,
    this_run: str,
) -> tuple[dict[str, Any], dict[str, Any], list[int]]:
    """``auto``: the newest trusted run that kept an artifact named ``prefix``..., the artifact,
    and the newer trusted runs passed over because they kept none (at most MAX_RUNS_TRIED
    runs are asked for their artifacts)."""
    if not workflow or not branch:
        raise ApiError("baseline auto needs GITHUB_WORKFLOW_REF and a branch (GITHUB_BASE_REF)")
    passed: list[int] = []
    runs = candidate_runs(api, workflow=workflow, branch=branch, status=status, this_run=this_run)
    for run in runs:
        try:
            return run, find_artifact(api, run["id"], prefix, rest), passed
        except NoArtifact:
            passed.append(run["id"])
        if len(passed) >= MAX_RUNS_TRIED:
            break
    which = "successful" if status == "success" else "finished"
    if not passed:
        events = ", ".join(TRUSTED_EVENTS)
        raise ApiError(f"no {which} run of {workflow} on {branch} yet ({events} runs of "
                       f"{api.repository} count; pull request runs never do)")  # fmt: skip
    runs_text = f"run {passed[0]}" if len(passed) == 1 else f"the {len(passed)} newest {which} runs"
    raise ApiError(f"{runs_text} kept no unexpired artifact named {prefix}*")


def find_artifact(
    api: GitHub, run_id: int, prefix: str, rest: re.Pattern[str] | None = None
) -> dict[str, Any]:
    """The run's newest unexpired artifact named ``prefix`` exactly, else whose name starts
    with ``prefix`` (and, with ``rest``, goes on as ``rest`` matches)."""
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
            and _named(str(a.get("name", "")), prefix, rest)
            and a.get("expired") is False
        ]
        if len(artifacts) < 100:
            break
    found = [a for a in found if a.get("name") == prefix] or found
    if not found:
        raise NoArtifact(f"run {run_id} kept no unexpired artifact named {prefix}*")
    return max(found, key=lambda a: (str(a.get("created_at") or ""), a["id"]))


def _named(name: str, prefix: str, rest: re.Pattern[str] | None) -> bool:
    if not name.startswith(prefix):
        return False
    return name == prefix or rest is None or rest.fullmatch(name[len(prefix) :]) is not None


def extract(archive: Path, into: Path, names: tuple[str, ...] = REPORTS) -> list[str]:
    """Copy ``names`` at the archive's top level into ``into``; what was left out, and why."""
    skipped = []
    count, directory = directory_size(archive)
    if count > MAX_ENTRIES:
        raise ApiError(f"the artifact holds more than {MAX_ENTRIES} files")
    if directory > MAX_DIRECTORY:
        raise ApiError(f"the artifact's directory is larger than {MAX_DIRECTORY >> 20} MiB")
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
    """The most members and the largest central directory that any end record claims, read as
    zipfile may read them, before it parses the directory (keeping its every entry in memory):
    the classic record, and with a zip64 locator right before it, the zip64 record both right
    before the locator (Python 3.11's zipfile, whatever the classic record says) and where the
    locator points (newer ones). Records that disagree are refused; the classic record's
    "see zip64" values (0xFFFF, 0xFFFFFFFF) count only when a zip64 record is not in both
    places."""
    size = archive.stat().st_size
    start = max(0, size - (22 + 0xFFFF))
    with open(archive, "rb") as handle:
        handle.seek(start)
        tail = handle.read()
        end = start + _end_record(tail)
        entries, directory = struct.unpack("<HI", tail[end - start + 10 : end - start + 16])
        handle.seek(max(0, end - 20))
        locator = handle.read(20) if end >= 20 else b""
        if locator[:4] != b"PK\x06\x07":
            return entries, directory
        (pointed,) = struct.unpack("<Q", locator[8:16])
        records = []
        for offset in (end - 20 - 56, pointed):
            handle.seek(max(0, min(offset, size)))
            record = handle.read(56)
            if offset >= 0 and len(record) == 56 and record[:4] == b"PK\x06\x06":
                records.append(record)
    if len(set(records)) > 1:
        raise zipfile.BadZipFile("two zip64 end records that disagree")
    counts = [] if len(records) == 2 and entries == 0xFFFF else [entries]
    sizes = [] if len(records) == 2 and directory == 0xFFFFFFFF else [directory]
    for record in records[:1]:
        this_disk, total, directory64 = struct.unpack("<QQQ", record[24:48])
        counts += [this_disk, total]
        sizes.append(directory64)
    return max(counts), max(sizes)


def _end_record(tail: bytes) -> int:
    """Where zipfile finds the classic end record in the archive's last 64 KiB + 22 bytes."""
    if len(tail) >= 22 and tail[-22:-18] == b"PK\x05\x06" and tail[-2:] == b"\0\0":
        return len(tail) - 22  # no comment: zipfile looks here first
    at = tail.rfind(b"PK\x05\x06")
    if at < 0 or len(tail) - at < 22:
        raise zipfile.BadZipFile("no end of central directory")
    return at


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
    rest: re.Pattern[str] | None = None,
    environ: dict[str, str] | os._Environ[str] = os.environ,
) -> Fetched:
    """``names`` from the baseline's artifact in ``into``, or the reason there are none (never
    raises). ``status``: which runs count (:func:`trusted`); ``rest``: :func:`find_artifact`."""
    out = Fetched()
    try:
        if spec.isdigit():
            run = find_run(api, spec)
            artifact = find_artifact(api, run["id"], prefix, rest)
        else:
            run, artifact, out.passed_over = newest_with_artifact(
                api, workflow=workflow_file(environ), branch=base_branch(environ),
                status=status, prefix=prefix, rest=rest,
                this_run=environ.get("GITHUB_RUN_ID", ""),
            )  # fmt: skip
        out.run = {
            k: run.get(k) for k in ("id", "head_sha", "head_branch", "created_at", "html_url")
        }
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
