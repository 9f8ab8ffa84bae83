"""The doctor report: JSON first; the console table and the Markdown are made from it.

The report is a :class:`~dlci.report.fields.DoctorReport` from :func:`build` to every reader:
a doctor.json read back (the host's copy, a script-mode child's answer) becomes one through
:func:`read`, which names a field of the wrong type before anything reads it.
"""

from __future__ import annotations

import sys
import textwrap
import time
from dataclasses import asdict
from typing import Any

from msgspec import UNSET

from dlci.report import fields
from dlci.report.console import table_console
from dlci.report.fields import CheckEntry, DoctorReport, PolicyEntry, Waived, WaiverEntry
from dlci.report.text import clean, md, md_code, table

SCHEMA_VERSION = 1
REPORT_NAME = "doctor.json"
ICONS = {"pass": "✅", "warn": "⚠️", "fail": "❌", "skip": "⏭️", "crashed": "💥"}
STYLES = {
    "pass": "green",
    "warn": "yellow",
    "fail": "bold red",
    "skip": "dim",
    "crashed": "magenta",
}


def read(raw: Any) -> DoctorReport:
    """A decoded doctor.json as the report's classes; ValueError naming each field of a wrong
    type (fields.problems), or the first required one missing (an incomplete report).

    >>> read({"verdict": "pass", "counts": {}, "checks": []}).waivers
    []
    >>> read({"verdict": "pass", "counts": {}, "checks": [{"id": 3}]})
    Traceback (most recent call last):
    ValueError: doctor.json: checks[0].id is a number, expected text
    >>> read({"verdict": "pass", "checks": []})
    Traceback (most recent call last):
    ValueError: doctor.json is incomplete: Object missing required field `counts`
    """
    return fields.read_as("doctor", DoctorReport, raw)


def build(
    results: list[Any],
    *,
    target: str,
    tier: dict[str, Any],
    seed: int,
    waivers: list[WaiverEntry] | None = None,
    policy: PolicyEntry | None = None,
) -> DoctorReport:
    """The doctor.json document for a list of check results (``CheckResult``).

    ``counts`` has one key per status, and ``ran``: the checks that ran to a status other
    than skip. A crashed check gives no evidence, so it fails the verdict (with a reason);
    so does a waiver past its date, which no longer applies. ``waivers`` lists the project's
    waivers, each with ``expired``, ``applied`` and ``status_without_waiver``; ``policy``
    is where they and the thresholds came from, with the thresholds that differ from the
    defaults.
    """
    counts: dict[str, int] = {status: sum(r.status == status for r in results) for status in ICONS}
    counts["ran"] = len(results) - counts["skip"]
    counts["following"] = sum(bool(getattr(r, "follows", None)) for r in results)
    crashed = [r.id for r in results if r.status == "crashed"]
    expired = [w for w in waivers or [] if w.expired]
    checks = [_check(r) for r in results]
    reasons = [root_reason(checks)] if counts["fail"] else []
    reasons += [f"checks crashed, so they gave no verdict: {', '.join(crashed)}"] if crashed else []
    reasons += [expired_reason(w) for w in expired]
    return DoctorReport(
        schema_version=SCHEMA_VERSION,
        kind="doctor",
        created_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        target=target,
        seed=seed,
        tier=tier,
        verdict="fail" if counts["fail"] or crashed or expired else "pass",
        counts=counts,
        checks=checks,
        roots=[r.id for r in results if r.status == "fail" and not getattr(r, "follows", None)],
        waivers=list(waivers or []),
        policy=policy or PolicyEntry(),
        reason="; ".join(reasons) if reasons else UNSET,
    )


def root_reason(checks: list[CheckEntry]) -> str:
    """The failures, roots first: ``zero-grad failed; label-alignment may follow from it``.

    >>> failed = {"status": "fail", "measured": "", "expected": "", "cause": "", "fix": ""}
    >>> root_reason([CheckEntry(id="a", **failed), CheckEntry(id="b", follows=["a"], **failed)])
    'a failed; b may follow from a'
    """
    roots = [c.id for c in checks if c.status == "fail" and not c.follows]
    text = f"{', '.join(roots)} failed" if roots else ""
    by_root: dict[str, list[str]] = {}
    for check in checks:
        if check.status == "fail" and check.follows:
            by_root.setdefault(", ".join(check.follows), []).append(check.id)
    followers = [f"{', '.join(ids)} may follow from {root}" for root, ids in by_root.items()]
    return "; ".join([text, *followers] if text else followers)


def _check(result: Any) -> CheckEntry:
    """One check's entry; ``waived`` only where a waiver applied."""
    waived = result.waived
    return CheckEntry(
        id=result.id,
        status=result.status,
        measured=result.measured,
        expected=result.expected,
        cause=result.cause,
        fix=result.fix,
        details=asdict(result)["details"],  # a copy, as the report's: dataclasses as dicts
        seconds=result.seconds,
        waived=UNSET if waived is None else Waived(**waived),
        follows=list(result.follows),
    )


def expired_reason(waiver: WaiverEntry) -> str:
    """Why an expired waiver fails the doctor: the check, the date, where it is set, and
    what to do."""
    where = f" ({waiver.source})" if waiver.source else ""
    return (
        f"the waiver for {waiver.check} expired on {waiver.until}{where}: it no longer "
        "applies; renew it with a new reason and date, or remove it"
    )


def _tally(counts: dict[str, int]) -> str:
    """``1 failed, 0 warnings, 13 passed, 2 skipped: 14 of 16 checks ran``; older reports
    have no ``crashed`` or ``ran``."""
    crashed = counts.get("crashed", 0)
    following = counts.get("following", 0)
    total = sum(counts.get(status, 0) for status in ICONS)
    ran = counts.get("ran", total - counts.get("skip", 0))
    return (
        f"{counts.get('fail', 0)} failed, "
        + (
            f"{following} of the failures and warnings may follow from an earlier one, "
            if following
            else ""
        )
        + (f"{crashed} crashed, " if crashed else "")
        + f"{counts.get('warn', 0)} warnings, {counts.get('pass', 0)} passed, "
        f"{counts.get('skip', 0)} skipped: {ran} of {total} checks ran"
    )


def render_markdown(report: DoctorReport) -> str:
    """The job-summary section: one row per check; cause and fix for anything but pass; the
    project's waivers, each with its reason, expiry and where it is set."""
    head = "✅" if report.verdict == "pass" else "❌"
    rows = []
    for check in report.checks:
        advice = ""
        if check.status != "pass":
            advice = md(check.cause) + (f"; fix: {md(check.fix)}" if check.fix else "")
        rows.append(
            [
                md_code(check.id),
                f"{ICONS.get(check.status, '')} {md(check.status)}"
                + (" (waived)" if check.waived else ""),
                md(check.measured),
                md(check.expected),
                advice,
            ]
        )
    headers = ["check", "status", "measured", "expected", "cause and fix"]
    lines = [f"### {head} Debugging checks: {_tally(report.counts)}", ""]
    if report.reason and report.verdict != "pass":
        lines += [f"Verdict fail: {md(report.reason)}", ""]
    lines += table(headers, rows)
    if report.waivers:
        lines += ["", "#### Waived checks", "", *_waiver_table(report.waivers)]
    return "\n".join(lines) + "\n"


def _waiver_table(waivers: list[WaiverEntry]) -> list[str]:
    rows = [
        [
            md_code(w.check),
            md(w.mode),
            md(w.reason),
            ("❌ expired " if w.expired else "") + md(w.until or "no date"),
            md(w.source or "-"),
            md(waiver_effect(w)),
        ]
        for w in waivers
    ]
    return table(["check", "mode", "reason", "until", "source", "effect"], rows)


def waiver_effect(waiver: WaiverEntry) -> str:
    """What a waiver did in this run, in a few words.

    >>> waiver_effect(WaiverEntry(applied=True, mode="warn-only", status_without_waiver="fail"))
    'fail read as warn'
    >>> waiver_effect(WaiverEntry(expired=True, status_without_waiver="fail"))
    'expired, so not applied (the check ran as usual: fail); the verdict fails'
    """
    before = waiver.status_without_waiver
    if waiver.expired:
        ran = f" (the check ran as usual: {before})" if before else ""
        return f"expired, so not applied{ran}; the verdict fails"
    if not waiver.applied:
        return "not applied: the check was not run (--only or --stop-on-fail)"
    if waiver.mode == "skip":
        return "the check was not run"
    return "fail read as warn" if before == "fail" else f"{before}: nothing to waive"


LOG_COLUMNS = 120  # the width of the doctor's output when it is not a terminal (a CI log)


def print_table(report: DoctorReport, file: Any = None) -> None:
    """The doctor's table: on a terminal a rich table at its width; otherwise (a CI log, a
    pipe) one block per check, wrapped to LOG_COLUMNS. Outside text is shown as plain text,
    never as markup."""
    stream = file or sys.stdout
    if not stream.isatty():
        stream.write("\n".join(compact_lines(report)) + "\n")
        return
    from rich.table import Table
    from rich.text import Text

    grid = Table("check", "status", "measured", "expected", "cause / fix", title="dlci doctor")
    for check in report.checks:
        advice = ""
        if check.status != "pass":
            advice = clean(check.cause) + (f"\nfix: {clean(check.fix)}" if check.fix else "")
        grid.add_row(
            Text(clean(check.id)),
            Text(
                clean(check.status) + (" (waived)" if check.waived else ""),
                style=STYLES.get(check.status, ""),
            ),
            Text(clean(check.measured)),
            Text(clean(check.expected)),
            Text(advice),
        )
    console = table_console(stream)
    console.print(grid)
    for line in _closing_lines(report):
        console.print(Text(line), highlight=False)


def compact_lines(report: DoctorReport, width: int = LOG_COLUMNS) -> list[str]:
    """The doctor's results for a log: a line (or a few, wrapped) per check with its status
    and what it measured; for anything but a pass, what was expected, the cause and the fix,
    indented under it. No line is longer than ``width``.

    >>> report = read({"verdict": "fail", "checks": [{"id": "zero-grad", "status": "fail",
    ...     "measured": "5 of 6", "expected": "none", "cause": "gradients accumulate",
    ...     "fix": "call zero_grad"}], "counts": {"fail": 1}})
    >>> for line in compact_lines(report):
    ...     print(line)
    dlci doctor
    fail  zero-grad  5 of 6
            expected: none
            cause: gradients accumulate
            fix: call zero_grad
    1 failed, 0 warnings, 0 passed, 0 skipped: 1 of 1 checks ran
    """

    def wrap(text: str, first: str, rest: str) -> list[str]:
        return textwrap.wrap(
            text or "-", width, initial_indent=first, subsequent_indent=rest,
            break_long_words=True, break_on_hyphens=False,
        ) or [first.rstrip()]  # fmt: skip

    checks = report.checks
    id_width = min(max((len(clean(c.id)) for c in checks), default=0), 24)
    lines = ["dlci doctor"]
    for check in checks:
        status = clean(check.status) + (" (waived)" if check.waived else "")
        head = f"{status:<5} {clean(check.id):<{id_width}}  "
        said = check.measured or (check.cause if check.status == "skip" else "")
        lines += wrap(clean(said), head, " " * 8)
        if check.status == "pass":
            continue
        for label, text in (
            ("expected", check.expected),
            ("cause", check.cause),
            ("fix", check.fix),
        ):
            if text and not (label == "cause" and said is check.cause):
                lines += wrap(clean(text), f"{' ' * 8}{label}: ", " " * 10)
    for line in _closing_lines(report):
        lines += wrap(line, "", "  ")
    return lines


def _closing_lines(report: DoctorReport) -> list[str]:
    """The tally, the project's waivers and the verdict's reason."""
    lines = [_tally(report.counts)]
    for waiver in report.waivers:
        until = f"until {clean(waiver.until)}" if waiver.until else "no end date"
        lines.append(
            f"waiver: {clean(waiver.check)} {clean(waiver.mode)}, {until} "
            f"({clean(waiver.source or 'no source')}): "
            f"{clean(waiver.reason)}; {waiver_effect(waiver)}"
        )
    if report.reason and report.verdict != "pass":
        lines.append(f"verdict fail: {clean(report.reason)}")
    return lines
