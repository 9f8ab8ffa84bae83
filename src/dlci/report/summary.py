"""The job summary in Markdown (GITHUB_STEP_SUMMARY), from what dlci.action.host.summary collected.

Every name and message in it came from a file the job wrote, that is from the pull request's
code: each goes through ``dlci.report.text`` (``md``, ``md_code``) and every table through
``table``, so no name can add a row, a heading, HTML or a workflow command.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dlci.report.doctor import render_markdown as doctor_md
from dlci.report.fields import (
    Cleanup,
    DoctorReport,
    Memorization,
    RunRecord,
    RunStep,
    Timing,
    Utilization,
)
from dlci.report.memorization import render_markdown as memorization_md
from dlci.report.text import bullets, md, md_code, table
from dlci.report.utilization import memory_fact
from dlci.report.utilization import render_markdown as utilization_md

ICON = {
    "passed": "✅",
    "failed": "❌",
    "error": "💥",
    "interrupted": "⛔",
    "skipped": "⏭️",
    "running": "⛔",
}
MAX_FAILED_TESTS = 20


@dataclass
class JobData:
    """What a job left, read and checked (dlci.action.host.summary.collect): each report in its
    classes, or None when it is missing or was not shown (the problem named in ``problems``).

    preflight.json stays a mapping (dlci.trust.host reads its configuration); the fields the
    summary shows of it are checked first (fields.Preflight). ``tests`` is junit.xml's counts
    (action.host.testfiles), ``waivers`` the trusted waivers' rows (dlci.trust.host).
    """

    preflight: dict[str, Any] | None = None
    run: RunRecord | None = None
    cleanup: Cleanup | None = None
    memorization: Memorization | None = None
    doctor: DoctorReport | None = None
    utilization: Utilization | None = None
    tests: dict[str, Any] | None = None
    coverage: float | None = None
    problems: list[str] = field(default_factory=list)
    incomplete: list[str] = field(default_factory=list)  # reports too partial for a section
    waivers: list[dict[str, Any]] = field(default_factory=list)
    config_notes: list[str] = field(default_factory=list)
    verified: list[str] = field(default_factory=list)  # what the host checked itself
    verdict: str = "pass"


def render(data: JobData, *, title: str = "dl-ci") -> str:
    """The job summary in Markdown; the reports' own sections are reused as they are."""
    passed = data.verdict == "pass"
    lines = [f"## {'✅' if passed else '❌'} {md(title)}: {'passed' if passed else 'FAILED'}", ""]
    if data.problems:
        lines += [*bullets(md(problem) for problem in data.problems), ""]
    lines += [*table(["", ""], facts(data)), ""]
    if data.run:
        lines += ["### Steps", "", *table(["step", "status", "time"], _step_rows(data.run)), ""]
    lines += _failed_step_logs(data.run)
    lines += configuration_lines(data)
    tests = data.tests
    if tests and tests["failed_cases"]:
        cases = tests["failed_cases"][:MAX_FAILED_TESTS]
        items = (f"{md_code(c['name'])}: {md(c['message'], limit=200)}" for c in cases)
        lines += ["### Failed tests", "", *bullets(items), ""]
    lines += _report_sections(data)
    lines.append(
        "The loss curve, the trace (open it in Perfetto) and every report are in the job's "
        "artifacts."
    )
    return "\n".join(lines)


def _failed_step_logs(run: RunRecord | None) -> list[str]:
    """Each failed step's last lines (from its log), each line a code span: the cause of the
    failure in the summary, not only the step's name."""
    lines: list[str] = []
    for step in run.steps if run else []:
        if step.status not in ("failed", "error"):
            continue
        tail = log_cause(step)
        if tail:
            lines += [f"### The last lines of step {md(step.name or '?')}", ""]
            lines += [*bullets(md_code(line) for line in tail), ""]
    return lines


def log_cause(step: RunStep, lines: int = 10) -> list[str]:
    """The last non-blank lines a step printed (its ``log_tail`` in run.json): where its
    error is, for the summary to show beside the step's name.

    >>> log_cause(RunStep(log_tail=["Building...", "", "ERROR: editables is needed", "  "]))
    ['Building...', 'ERROR: editables is needed']
    """
    tail = step.log_tail or []
    return [line.rstrip()[:300] for line in tail if line.strip()][-lines:]


def facts(data: JobData) -> list[list[str]]:
    """The key-value rows at the top: tier, hardware, tests, coverage, the reports' verdicts."""
    rows: list[list[str]] = []
    pre = data.preflight or {}
    tier = pre.get("tier") or {}
    if tier:
        rows.append(["tier", _tier_text(tier)])
        where = " (GPU)" if pre.get("gpu") else " (CPU path)"
        rows.append(["hardware", md(tier.get("hardware_class")) + where])
    tests = data.tests
    if tests:
        rows.append(
            [
                "tests",
                f"{tests['passed']} passed, {tests['failures']} failed, {tests['errors']} "
                f"errors, {tests['skipped']} skipped",
            ]
        )
    if data.coverage is not None:
        rows.append(["coverage", f"{data.coverage:.1f}% of lines"])
    rows += _report_facts(data)
    if data.verified:
        rows.append(["verified by the host", md("; ".join(data.verified))])
    else:
        rows.append(["verified by the host", "nothing: no host record of the container run"])
    return rows


def configuration_lines(data: JobData) -> list[str]:
    """The trusted configuration's waivers (each with its reason, expiry and where it was
    set) and its notes (what a pull request's own change to it does), from the host's
    preflight.json.

    >>> w = {"check": "lr", "mode": "skip", "reason": "r", "until": None, "source": "x:3"}
    >>> configuration_lines(JobData(waivers=[w]))[2]
    '| check | mode | reason | until | set in |'
    """
    lines: list[str] = []
    waivers = data.waivers
    if waivers:
        rows = [
            [
                md_code(w.get("check")),
                md(w.get("mode")),
                md(w.get("reason"), limit=200),
                md(w.get("until") or "no expiry") + (" (**expired**)" if w.get("expired") else ""),
                md(w.get("source") or "?"),
            ]
            for w in waivers
        ]
        lines += ["### Waived checks", ""]
        lines += [*table(["check", "mode", "reason", "until", "set in"], rows), ""]
    notes = data.config_notes
    if notes:
        lines += ["### Configuration", "", *bullets(md(note) for note in notes), ""]
    return lines


def _tier_text(tier: dict[str, Any]) -> str:
    return (
        f"{md(tier.get('budget'))} on {md(tier.get('hardware_class'))}: up to "
        f"{md(tier.get('max_epochs'))} "
        f"epochs to {_criterion(tier)}, {md(tier.get('time_cap_minutes'))} min, "
        f"{md(tier.get('profile_steps'))} profiled steps"
    )


def _criterion(tier: dict[str, Any]) -> str:
    """What memorised means at ``tier`` (as ``dlci tier`` wrote it), escaped; or its absolute
    threshold for a tier written before the criterion was recorded."""
    if tier.get("criterion"):
        return md(tier["criterion"])
    return f"loss < {md(tier.get('max_loss'))}"


def _goal(mem: Memorization) -> str:
    """What the run had to reach: its criterion (relative goals have no absolute threshold),
    else the absolute threshold; never "threshold None"."""
    if mem.criterion:
        return f"goal: {md(mem.criterion)}"
    if mem.threshold is not None:
        return f"threshold {md(mem.threshold)}"
    return "no goal recorded"


def _number(value: object, spec: str) -> str:
    """A number formatted by ``spec``; anything else (a hostile file) as escaped text."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return format(value, spec)
    return md(value)


def _report_facts(data: JobData) -> list[list[str]]:
    rows: list[list[str]] = []
    mem = data.memorization
    if mem:
        loss = mem.best_loss
        best = "None" if loss is None else _number(loss, ".4g")
        verdict = md((mem.verdict or "?").upper())
        rows.append(["memorization", f"{verdict}: best loss {best} ({_goal(mem)})"])
    util = data.utilization
    if util:
        value = util.gpu_utilization_pct
        shown = "CPU-only trace" if value is None else _number(value, ".1f") + "%"
        count = md(util.steps.count)
        rows.append(["GPU utilization", f"{shown} over {count} profiled steps"])

        memory = memory_fact(util.memory)
        if memory:
            rows.append(["memory", memory])
    doctor = data.doctor
    if doctor:
        c = doctor.counts
        rows.append(
            [
                "debugging checks",
                f"{md(c.get('fail', 0))} failed, {md(c.get('warn', 0))} warnings, "
                f"{md(c.get('pass', 0))} passed"
                + (f", {md(c['crashed'])} crashed (dl-ci's own bug)" if c.get("crashed") else ""),
            ]
        )
    run = data.run
    if run and run.threads and run.threads.source:
        rows.append(["CPU threads", md(run.threads.source, limit=200)])
    if run and run.timing:
        rows.append(["where the time went", _time_split(run.timing)])
    cleanup = data.cleanup
    if cleanup:
        rows.append(
            [
                "cleanup",
                f"{md(cleanup.containers_removed)} container(s) removed, "
                f"{md(cleanup.ownership_restored)} file(s) given back, "
                f"{len(cleanup.gpu_processes)} GPU process(es) left",
            ]
        )
    return rows


def _time_split(timing: Timing) -> str:
    """The containers' time: the project's work, then the kit's own (dlci.action.host.gates)."""
    project = ", ".join(
        f"{md(name)} {_number(value, '.1f')} s" for name, value in timing.project.items()
    )
    kit = timing.kit
    own = (
        f"copies of the checkout {_number(kit.copies_s, '.1f')} s, "
        f"container start and stop {_number(kit.containers_s, '.1f')} s, "
        f"the install's image {_number(kit.commit_s, '.1f')} s"
    )
    return (
        f"the project's {_number(timing.project_s, '.1f')} s ({project}); "
        f"the kit's own {_number(timing.kit_s, '.1f')} s ({own})"
    )


def _step_rows(run: RunRecord) -> list[list[str]]:
    rows = []
    for step in run.steps:
        status = step.status or "?"
        if status == "running":
            status = "interrupted"
        note = f" ({md(step.reason, limit=400)})" if step.reason else ""
        seconds = _number(step.duration_s or 0, ".1f")
        icon = ICON.get(status, "")
        name = md(step.name or "?", limit=60)
        rows.append([name, f"{icon} {md(status, limit=40)}{note}", f"{seconds} s"])
    return rows


def _report_sections(data: JobData) -> list[str]:
    """The memorization, doctor and utilization reports' own Markdown, when they are there."""
    lines: list[str] = []
    reports = {"memorization": data.memorization, "doctor": data.doctor}
    for key, report in (*reports.items(), ("utilization", data.utilization)):
        if key in data.incomplete:
            lines.append(f"({key}.json is incomplete)")
        elif report:
            try:
                lines.append(_section(key, report))
            except (KeyError, TypeError, ValueError, AttributeError, IndexError):
                lines.append(f"({key}.json is incomplete)")
    return lines


def _section(key: str, report: DoctorReport | Memorization | Utilization) -> str:
    if isinstance(report, DoctorReport):
        return doctor_md(report)
    if isinstance(report, Utilization):
        return utilization_md(report, gate=report.gate or None)
    if isinstance(report, Memorization):
        return memorization_md(report)
    raise TypeError(f"{key}.json was not read into its classes")
