"""What the job left in dlci-artifacts/, read back for the job summary, outputs and annotations.

Host-side (no torch). Reads preflight.json, run.json, cleanup.json, junit.xml, coverage.xml,
memorization.json, doctor.json and utilization.json, and reports on whatever is there: a job
that failed early still gets a summary of what ran. A red run's bisect (bisect.json, which
dlci.action.host.bisect writes beside the host's reports) comes first, the culprit on top.

The container ran the pull request's code, so its files are claims. With the host's record
of the container run (dlci.action.host.gates, a file outside the workspace), the tier, the
hardware class and run.json come from that record, and each gate report must be the one the
host copied from that gate's own directory (its SHA-256) and name the host's tier. Nothing
is read in place: :func:`snapshot` first copies the regular files it needs (no link
followed, no FIFO opened, size caps) into a host folder, the host's reports from the folder
beside its record; with a record that folder is new, beside it, and is what the action uploads
(output ``artifacts-dir``), never the workspace's dlci-artifacts.

run.json, cleanup.json and the host's record are read into their classes (dlci.report.fields:
RunRecord, Cleanup, HostRecord), the gate reports too (:func:`type_problems`): a field of a
wrong type is a named problem and the file is not shown, never a crash. preflight.json stays a
mapping (dlci.trust.host reads its configuration), and :func:`evidence` reads a step's report
raw on purpose: it judges a claim, including fields dl-ci never writes.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from dlci import jsonio
from dlci.action.host.testfiles import coverage_rate, junit_counts
from dlci.bisect import render as bisect_render
from dlci.bisect.result import read_answer
from dlci.errors import DlciError
from dlci.fsutil import NOT_ALLOWED, copy_beneath, read_input
from dlci.report import doctor as doctor_report
from dlci.report import fields, html
from dlci.report import memorization as memorization_report
from dlci.report import utilization as utilization_report
from dlci.report.fields import HostRecord, RunRecord
from dlci.report.summary import JobData, log_cause, render
from dlci.report.text import md
from dlci.trust import host as trusted

MAX_TEST_ANNOTATIONS = 20
MAX_CHECK_ANNOTATIONS = 20  # failing doctor checks annotated; the summary lists them all
# GitHub drops a step summary over 1 MiB whole: the job's is cut below it, said
MAX_SUMMARY_BYTES = 900 << 10
GATE_REPORTS = ("memorization", "doctor", "utilization")
# The report that is a step's positive verdict: a step passes only on the one it wrote itself,
# whatever its exit code (docs/action.md, "A positive verdict").
EVIDENCE = {
    "tests": "junit.xml",
    "memorize": "memorization.json",
    "doctor": "doctor.json",
    "profile": "utilization.json",
}
T = TypeVar("T")
HOST_FILES = ("preflight.json", "cleanup.json")  # written on the host by steps of their own
READ = (*HOST_FILES, "run.json", *(f"{k}.json" for k in GATE_REPORTS), "junit.xml", "coverage.xml")
PARTIAL = ("exited", "error", "watchdog")  # a memorization.json the run did not finish
# The tier's values a gate report must share with the host's (a different one is a forgery
# or a step that selected its own tier).
TIER_KEYS = (
    "budget", "hardware_class", "max_epochs", "max_loss", "max_relative_loss", "time_cap_minutes",
    "profile_steps", "nproc", "batch_size",
)  # fmt: skip


@dataclass(frozen=True)
class Summary:
    """The job summary's Markdown, the step outputs, the annotations, and the verdict."""

    markdown: str
    outputs: dict[str, Any]
    annotations: list[tuple[str, str, str]]
    verdict: str


def summarize(
    folder: Path,
    *,
    title: str = "dl-ci",
    artifact_prefix: str = "",
    host_record: Path | None = None,
) -> Summary:
    """Everything ``dlci summary`` reports on the artifacts in ``folder``."""
    with tempfile.TemporaryDirectory(prefix="dlci-summary-") as tmp:
        into = Path(tmp)
        if host_record is not None:  # the upload's folder: new, beside the host's record
            into = Path(tempfile.mkdtemp(prefix="dlci-upload-", dir=host_record.parent))
        into /= "dlci-artifacts"
        left = snapshot(folder, read_record(host_record)[0] if host_record else None, into)
        data = collect(into, host_record)
        data.problems += [f"not copied: {why}" for why in left]
        data.verdict = "fail" if data.problems else "pass"
        # the job's HTML report, from the host's copies, with the host's verdict above the
        # gates' own claims: in the upload's folder, or (no host record, a local run) beside
        # the reports read
        page = html_report(into, data, None if host_record is not None else folder)
        top = bisect_top(into) if host_record is not None else ""
    values = outputs(data)
    if artifact_prefix:
        values["artifact-name"] = artifact_name(artifact_prefix, data)
    if host_record is not None:
        values["artifacts-dir"] = str(into)
    markdown = top + render(data, title=title)
    if isinstance(page, Path):
        where = (
            f"the artifact `{md(values['artifact-name'])}`"
            if values.get("artifact-name")
            else md(str(page.parent))
        )
        markdown += f"\n\nThe job's HTML report, every figure inside it: `{page.name}` in {where}."
    else:
        markdown += f"\n\nNo HTML report for this job: {md(page, limit=300)}."
    return Summary(cap(markdown), values, error_annotations(data), data.verdict)


def cap(markdown: str, limit: int = MAX_SUMMARY_BYTES) -> str:
    """The summary under ``limit`` bytes, cut at a line with a line saying so: GitHub drops a
    larger step summary whole (a report can hold megabytes of text).

    >>> cap("a\\nb\\nc\\n", limit=4).splitlines()
    ['a', 'b', '', '(The summary was cut at 4 bytes: every report is in the artifacts.)']
    """
    data = markdown.encode()
    if len(data) <= limit:
        return markdown
    kept = data[:limit].decode(errors="ignore").rsplit("\n", 1)[0]
    return (
        f"{kept}\n\n(The summary was cut at {limit:,} bytes: every report is in the artifacts.)\n"
    )


def bisect_top(folder: Path) -> str:
    """The bisect's answer (``bisect.json`` in the host's copies) for the summary's top, or
    a line on why it cannot be shown; '' when there was no bisect."""
    path = folder / "bisect.json"
    if not path.is_file() or path.is_symlink():
        return ""
    try:
        return bisect_render.markdown(read_answer(path)) + "\n"
    except DlciError as exc:
        why = exc.message.replace(str(path), path.name)  # the host's folder is no reader's
    except Exception as exc:  # as the HTML report: an answer is never worth the summary
        why = f"{type(exc).__name__}: {exc}"
    return f"dl-ci bisect: its answer cannot be shown: {md(why, limit=300)}\n\n"


def html_report(folder: Path, data: JobData, beside: Path | None) -> Path | str:
    """report.html from the reports in ``folder`` (the host's copies) and the host's verdict,
    into ``folder`` or, given, ``beside``; where it went, or why it could not be written: the
    summary, the outputs and the upload stand without it, whatever a report holds."""
    out = (beside if beside is not None else folder) / html.REPORT_NAME
    job = {"verdict": data.verdict, "problems": data.problems}
    try:
        return html.write_report(folder, out, job=job)
    except Exception as exc:  # a page is never worth the job's summary
        return f"{type(exc).__name__}: {exc}"


def snapshot(folder: Path, record: HostRecord | None, into: Path) -> list[str]:
    """Copy what the summary reads into the host folder ``into``: the host's reports (the
    record's ``reports_dir``), and from the workspace's ``folder`` the host steps' files only
    (every report it reads when there is no such folder); what was refused, one line each."""
    reports = record.reports_dir if record else ""
    left = []
    if reports and os.path.isdir(reports):
        left += copy_beneath(reports, ".", into, lambda p: True, limit=1 << 30, total=4 << 30)
    names = HOST_FILES if reports else READ
    try:
        left += copy_beneath(folder.parent, folder.name, into, names.__contains__)
    except DlciError as exc:
        left.append(exc.message)
    into.mkdir(parents=True, exist_ok=True)
    return [why for why in left if not why.endswith(NOT_ALLOWED)]


def read_report(path: Path) -> dict[str, Any] | None:
    """A JSON object from a report file, or None when it is missing, too big or not one."""
    try:
        value = jsonio.decode(read_input(path, what="report"))
    except (DlciError, jsonio.DecodeError):
        return None
    return value if isinstance(value, dict) else None


def read_record(path: Path) -> tuple[HostRecord | None, list[str]]:
    """The host's record of the container run read into its classes; None when it is missing
    or not a JSON object, and with what is wrong when a field has a wrong type."""
    raw = read_report(path)
    try:
        return (fields.read_host_record(raw) if raw is not None else None), []
    except ValueError as exc:
        return None, [str(exc), "the host's record is not read: its fields are not dl-ci's"]


def read_job_file(path: Path, read: Callable[[Any], T], problems: list[str]) -> T | None:
    """A file of the job read into its classes (``read``: fields.read_run, read_cleanup);
    None when it is missing or not a JSON object, or (named in ``problems``) when a field has
    a wrong type: such a file is not shown."""
    raw = read_report(path)
    if raw is None:
        return None
    try:
        return read(raw)
    except ValueError as exc:
        problems += [
            str(exc),
            f"{path.name} is not shown: its fields are not the types dl-ci writes",
        ]
        return None


def collect(folder: Path, host_record: Path | None = None) -> JobData:
    """Everything the job left, read and checked; missing or broken files are None.

    ``host_record``: the host's record of the container run; when given, the reports are
    checked against it (and a missing record after a passed preflight is a problem).
    """
    wrong: list[str] = []
    data = JobData(
        preflight=read_report(folder / "preflight.json"),
        run=read_job_file(folder / "run.json", fields.read_run, wrong),
        cleanup=read_job_file(folder / "cleanup.json", fields.read_cleanup, wrong),
        tests=junit_counts(folder / "junit.xml"),
        coverage=coverage_rate(folder / "coverage.xml"),
    )
    # the gate reports as decoded JSON (the edge): checked as claims and for their types
    # before they are read into their classes
    raw = {key: read_report(folder / f"{key}.json") for key in GATE_REPORTS}
    record, unread = read_record(host_record) if host_record is not None else (None, [])
    if record is not None:
        tier = record.tier
        data.preflight = record.preflight or ({"passed": True, "tier": tier} if tier else None)
        data.run = record.run or data.run
    if data.preflight is not None and fields.problems("preflight", data.preflight):
        wrong += fields.problems("preflight", data.preflight)
        wrong.append("preflight.json is not shown: its fields are not the types dl-ci writes")
        data.preflight = None
    claims = claim_problems(data, raw, folder, record, expected=host_record is not None)
    claims += type_problems(raw, data)
    run_unread = any(p.startswith("run.json") for p in wrong)  # named: not "did not run"
    found = problems(data.preflight, data.run, unread=run_unread)
    data.problems = unread + wrong + found + claims
    data.problems += record.problems if record else []
    data.problems += trusted.expired(data.preflight)
    data.waivers = trusted.waiver_rows(data.preflight)
    data.config_notes = trusted.notes(data.preflight)
    data.verified = verified(record)
    data.verdict = "fail" if data.problems else "pass"
    return data


def claim_problems(
    data: JobData,
    raw: dict[str, Any],
    folder: Path,
    record: HostRecord | None,
    *,
    expected: bool,
) -> list[str]:
    """The gate reports (``raw``: each decoded, or None) checked as claims: from the gate's
    own directory, at the host's tier. A report that fails a check is dropped from ``raw``
    (its verdict is not shown as a fact).
    """
    found: list[str] = []
    pre = data.preflight
    ran = data.run is not None and (pre is None or pre.get("passed"))
    if expected and record is None and ran:
        found.append(
            "the host's record of the container run is missing: the reports are unverified"
        )
    host_tier = (record.tier if record else None) or (pre or {}).get("tier") or {}
    copied = record.reports if record else {}
    for key in GATE_REPORTS:
        report, name = raw[key], f"{key}.json"
        if report is None:
            continue
        if record is not None and name not in copied:
            found.append(f"{name} did not come from its gate's own step (left in the workspace?)")
            raw[key] = None
            continue
        if record is not None and _sha256(folder / name) != copied[name].sha256:
            found.append(f"{name} was changed after the host collected it")
            raw[key] = None
            continue
        claimed = report.get("tier")
        if isinstance(claimed, dict) and host_tier:
            wrong = [k for k in TIER_KEYS if k in claimed and claimed[k] != host_tier.get(k)]
            if wrong:
                values = ", ".join(f"{k} {claimed[k]!r}, host {host_tier.get(k)!r}" for k in wrong)
                found.append(f"{name}: report does not match the tier the host chose ({values})")
                raw[key] = None
    return found


def type_problems(raw: dict[str, Any], data: JobData) -> list[str]:
    """Each gate report (``raw``: decoded, or None) checked for dl-ci's types
    (dlci.report.fields) and read into its classes in ``data``: a report with a field of a
    wrong type is left out and named, so a pull request's report can neither crash the
    summary nor reach it.

    A memorization.json is read even when partial (its section says it is incomplete); a
    doctor.json without a field every reader needs is left out and listed under
    ``incomplete`` (the summary says so where its section would be); a utilization.json's
    fields an older report lacks take defaults, so its facts are shown, and one without a
    section the Markdown draws from is listed under ``incomplete``."""
    found: list[str] = []
    data.incomplete = []
    for key in GATE_REPORTS:
        wrong = fields.problems(key, raw[key]) if raw[key] is not None else []
        if wrong:
            found += [*wrong, f"{key}.json is not shown: its fields are not the types dl-ci writes"]
            raw[key] = None
    mem = raw["memorization"]
    if mem is not None:
        try:
            data.memorization = memorization_report.read(mem)
        except ValueError as exc:  # the types are checked above: a value no field holds
            found += [str(exc), "memorization.json is not shown: it cannot be read"]
        else:
            if memorization_report.missing(mem):
                data.incomplete.append("memorization")
    if raw["doctor"] is not None:
        try:
            data.doctor = doctor_report.read(raw["doctor"])
        except ValueError as exc:  # the types are checked above: missing, or out of range
            found += _unread("doctor", exc, data)
    util = raw["utilization"]
    if util is not None:
        try:
            data.utilization = utilization_report.read(util)
        except ValueError as exc:
            found += _unread("utilization", exc, data)
        else:
            if any(k not in util for k in utilization_report.DRAWN):
                data.incomplete.append("utilization")
    return found


def _unread(key: str, error: ValueError, data: JobData) -> list[str]:
    """A gate report whose types are right that still cannot be read: one lacking a field
    every reader needs is incomplete (its section says so); one holding a value no field
    holds (an integer beyond 64 bits) is a problem, named, as a field of a wrong type is."""
    if "is incomplete" in str(error):
        data.incomplete.append(key)
        return []
    return [str(error), f"{key}.json is not shown: it cannot be read"]


def verified(record: HostRecord | None) -> list[str]:
    """What the host checked itself, for the summary's "verified by the host" row."""
    if record is None:
        return []
    done = []
    if record.tier:
        done.append("the tier (read-only in every container)")
    gates = record.isolated_parts
    if gates:
        names = sorted(record.reports)
        done.append(
            f"{', '.join(names) or 'no reports'} from the isolated step directories of "
            f"{', '.join(gates)}"
        )
    return done


def _sha256(path: Path) -> str:
    try:
        return hashlib.sha256(read_input(path, what="report")).hexdigest()
    except DlciError:
        return ""


def problems(
    pre: dict[str, Any] | None, run: RunRecord | None, *, unread: bool = False
) -> list[str]:
    """What failed the job: a refused preflight, steps that did not run or did not pass;
    ``unread``: run.json is there, its fields of wrong types named elsewhere.

    >>> run = fields.read_run({"steps": [{"name": "tests", "status": "failed"}]})
    >>> problems({"passed": True}, run)
    ['step tests failed']
    >>> problems({"passed": True}, fields.read_run({"steps": [{"name": "m", "status": "ok"}]}))
    ['step m: a status dl-ci never writes (ok)']
    """
    found: list[str] = []
    if pre is not None and not pre.get("passed"):
        found.append("preflight: " + str((pre.get("error") or {}).get("message", "failed")))
    if run is None:
        if (pre is None or pre.get("passed")) and not unread:
            found.append("the job's steps did not run (no run.json): see the job log")
        return found
    for step in run.steps:
        status = step.status
        if status in ("failed", "error", "interrupted", "running"):
            how = "was interrupted" if status in ("interrupted", "running") else status
            reason = f" ({step.reason})" if step.reason else ""
            last = log_cause(step)
            cause = f": {last[-1]}" if last and not reason else ""
            found.append(f"step {step.name or '?'} {how}{reason}{cause}")
        elif status not in ("passed", "skipped"):  # a record dl-ci did not write
            found.append(f"step {step.name or '?'}: a status dl-ci never writes ({status[:40]})")
    return found


def evidence(name: str, folder: Path, *, gpu_gate: bool = False) -> tuple[str, str]:
    """What the report a step wrote in ``folder`` says: ``(kind, words)``.

    kind is ``pass``, ``missing`` (no report, or one that does not parse), ``partial`` (the run
    ended inside the target's code: the report's reason), ``none`` (pytest ran no test) or
    ``fail``; the words complete "memorize exited 0 ...".
    """
    file = EVIDENCE[name]
    if name == "tests":
        return _junit(folder / file)
    if name == "profile" and not (folder / "trace.json.gz").is_file():
        return "missing", "without trace.json.gz"
    report = read_report(folder / file) if (folder / file).is_file() else None
    if report is None:
        broken = (folder / file).exists()
        return "missing", f"with an unreadable {file}" if broken else f"without {file}"
    if name == "profile":
        gate = report.get("gate")
        if gpu_gate and not (isinstance(gate, dict) and gate.get("passed") is True):
            said = gate.get("message") if isinstance(gate, dict) else "no gate in the report"
            return "fail", f"but {file}'s GPU utilization gate did not pass: {said}"
        return "pass", ""
    verdict, reason = report.get("verdict"), str(report.get("reason") or "")
    partial = report.get("stopped_by") in PARTIAL or (name == "doctor" and not report.get("checks"))
    if verdict == "pass" and not partial:
        return "pass", ""
    if partial:
        stopped = report.get("stopped_by") or "no checks ran"
        stuck = report.get("stuck_at")
        if stuck and str(stuck) not in reason:
            reason += f"; stuck at: {stuck}"
        return "partial", f"with a partial {file} ({stopped}): {reason or 'no reason given'}"
    return "fail", f"but {file} says {verdict}: {reason or 'no reason given'}"


def _junit(path: Path) -> tuple[str, str]:
    counts = junit_counts(path)
    if counts is None:
        return (
            "missing",
            f"with an unreadable {path.name}" if path.exists() else "without junit.xml",
        )
    if counts["failures"] or counts["errors"]:
        return (
            "fail",
            f"but junit.xml counts {counts['failures']} failures, {counts['errors']} errors",
        )
    if not counts["tests"]:
        return "none", "but junit.xml counts no tests"
    return "pass", ""


PASSED = {"pass": "true", "fail": "false"}  # output memorization-passed of a verdict


def outputs(data: JobData) -> dict[str, Any]:
    """The action's step outputs (GITHUB_OUTPUT) from the collected reports."""
    tier = (data.preflight or {}).get("tier") or {}
    mem, util = data.memorization, data.utilization
    return {
        "verdict": data.verdict,
        "hardware-class": tier.get("hardware_class", ""),
        "tier": jsonio.encode(tier, indent=False).decode() if tier else "",
        "memorization-loss": "" if mem is None or mem.best_loss is None else mem.best_loss,
        "memorization-passed": "" if mem is None else PASSED.get(mem.verdict, ""),
        "gpu-utilization": ""
        if util is None or util.gpu_utilization_pct is None
        else util.gpu_utilization_pct,
        "coverage": "" if data.coverage is None else data.coverage,
    }


def artifact_name(prefix: str, data: JobData) -> str:
    """``prefix-class-jobid``: artifacts are immutable (upload-artifact v4), so matrix legs and
    re-runs each need their own name.

    >>> artifact_name("dlci", JobData(preflight={"tier": {"hardware_class": "a100"}}))[:10]
    'dlci-a100-'
    """
    tier = (data.preflight or {}).get("tier") or {}
    job = os.environ.get("DLCI_JOB_ID") or f"local-{os.getpid()}"
    name = f"{prefix}-{tier.get('hardware_class', 'unknown')}-{job}"
    return re.sub(r'[":<>|*?\\/\r\n]', "-", name)


def error_annotations(data: JobData) -> list[tuple[str, str, str]]:
    """``(level, message, title)`` of every ``::error`` annotation the job earns."""
    out: list[tuple[str, str, str]] = [("error", p, "dl-ci") for p in data.problems]
    tests = data.tests
    if tests:
        for case in tests["failed_cases"][:MAX_TEST_ANNOTATIONS]:
            oom = "out of memory" in case["message"].lower()
            title = "test ran out of memory" if oom else "test failed"
            out.append(("error", f"{case['name']}: {case['message']}", title))
    mem = data.memorization
    if mem and mem.verdict == "fail":
        out.append(("error", mem.reason or "the memorization test failed", "memorization"))
    doctor = data.doctor
    if doctor:
        failed = [c for c in doctor.checks if c.status == "fail"]
        for check in sorted(failed, key=lambda c: bool(c.follows))[:MAX_CHECK_ANNOTATIONS]:
            out.append(("error", f"{check.id}: {check.cause}", "dlci doctor"))  # roots first
    util = data.utilization
    if util and util.gate and not util.gate.passed:
        out.append(("error", util.gate.message, "GPU utilization"))
    return out
