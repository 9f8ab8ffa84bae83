"""``dlci summary``: the job summary, step outputs and annotations, from dlci-artifacts/.

Host-side (no torch). Reads what the job wrote (preflight.json, run.json, cleanup.json,
junit.xml, coverage.xml, memorization.json, doctor.json, utilization.json) and reports on
whatever is there: a job that failed early still gets a summary of what ran. Exit 1 when
the job failed, so the summary step can carry the verdict.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dlci.commands import _common
from dlci.errors import DlciError

ICON = {
    "passed": "✅",
    "failed": "❌",
    "error": "💥",
    "interrupted": "⛔",
    "skipped": "⏭️",
    "running": "⛔",
}
MAX_TEST_ANNOTATIONS = 20


def main(argv: Sequence[str]) -> int:
    p = _common.parser(
        "summary",
        "Write the job summary (GITHUB_STEP_SUMMARY), the step outputs (GITHUB_OUTPUT) and "
        "::error annotations from the reports in the artifacts directory. Exit 1 when the "
        "job failed.",
    )
    p.add_argument("--artifacts", default="dlci-artifacts", metavar="DIR")
    p.add_argument(
        "--markdown",
        metavar="FILE",
        default=os.environ.get("GITHUB_STEP_SUMMARY") or None,
        help="append the summary to FILE (default: $GITHUB_STEP_SUMMARY, else print it)",
    )
    p.add_argument("--no-fail", action="store_true", help="exit 0 whatever the verdict")
    p.add_argument("--title", default="dl-ci", help="the summary's heading")
    p.add_argument(
        "--artifact-prefix",
        default="",
        metavar="NAME",
        help="also output artifact-name: NAME-<hardware class>-<job id>, unique per matrix leg",
    )
    args = p.parse_args(list(argv))

    folder = Path(args.artifacts)
    data = collect(folder)
    text = render(data, title=args.title)
    if args.markdown:
        try:
            with open(args.markdown, "a", encoding="utf-8") as handle:
                handle.write(text + "\n")
        except OSError as exc:
            raise DlciError(
                f"{args.markdown}: cannot append the summary ({exc.strerror})"
            ) from None
    else:
        print(text)

    from dlci.report.github import annotation, in_github_actions, write_outputs

    values = outputs(data)
    if args.artifact_prefix:
        values["artifact-name"] = artifact_name(args.artifact_prefix, data)
    write_outputs(values)
    for level, message, title in annotations(data):
        if in_github_actions():
            print(annotation(level, message, title=title), flush=True)
        else:
            print(f"{level}: {title}: {message}", file=sys.stderr)
    if data["verdict"] == "fail" and not args.no_fail:
        return 1
    return 0


def _load(path: Path) -> dict[str, Any] | None:
    import orjson

    try:
        value = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None
    return value if isinstance(value, dict) else None


def collect(folder: Path) -> dict[str, Any]:
    """Everything the job left, parsed; missing or broken files are None."""
    data: dict[str, Any] = {
        "preflight": _load(folder / "preflight.json"),
        "run": _load(folder / "run.json"),
        "cleanup": _load(folder / "cleanup.json"),
        "memorization": _load(folder / "memorization.json"),
        "doctor": _load(folder / "doctor.json"),
        "utilization": _load(folder / "utilization.json"),
        "tests": junit_counts(folder / "junit.xml"),
        "coverage": coverage_rate(folder / "coverage.xml"),
    }
    problems = []
    pre, run = data["preflight"], data["run"]
    if pre is not None and not pre.get("passed"):
        problems.append("preflight: " + (pre.get("error") or {}).get("message", "failed"))
    if run is None:
        if pre is None or pre.get("passed"):
            problems.append("the job's steps did not run (no run.json): see the job log")
    else:
        for step in run.get("steps", []):
            if step.get("status") in ("failed", "error", "interrupted", "running"):
                how = (
                    "was interrupted"
                    if step["status"] in ("interrupted", "running")
                    else step["status"]
                )
                reason = f" ({step['reason']})" if step.get("reason") else ""
                problems.append(f"step {step['name']} {how}{reason}")
    data["problems"] = problems
    data["verdict"] = "fail" if problems else "pass"
    return data


def junit_counts(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    import xml.etree.ElementTree as ET

    try:
        root = ET.parse(path).getroot()  # noqa: S314 - pytest wrote it in this job
    except ET.ParseError:
        return None
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    for suite in suites:
        for key in counts:
            with contextlib.suppress(ValueError):
                counts[key] += int(suite.get(key, 0))
    failed = []
    for case in root.iter("testcase"):
        problem = case.find("failure") if case.find("failure") is not None else case.find("error")
        if problem is not None:
            failed.append(
                {
                    "name": f"{case.get('classname', '')}::{case.get('name', '')}".strip(":"),
                    "file": case.get("file", ""),
                    "line": case.get("line", ""),
                    "message": (problem.get("message") or "").strip()[:300],
                }
            )
    counts["passed"] = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    counts["failed_cases"] = failed
    return counts


def coverage_rate(path: Path) -> float | None:
    if not path.is_file():
        return None
    import xml.etree.ElementTree as ET

    try:
        root = ET.parse(path).getroot()  # noqa: S314 - coverage.py wrote it in this job
        return round(100.0 * float(root.get("line-rate", "nan")), 2)
    except (ET.ParseError, ValueError):
        return None


def outputs(data: dict[str, Any]) -> dict[str, Any]:
    import orjson

    tier = (data["preflight"] or {}).get("tier") or {}
    mem = data["memorization"] or {}
    util = data["utilization"] or {}
    values = {
        "verdict": data["verdict"],
        "hardware-class": tier.get("hardware_class", ""),
        "tier": orjson.dumps(tier).decode() if tier else "",
        "memorization-loss": "" if mem.get("best_loss") is None else mem["best_loss"],
        "memorization-passed": {"pass": "true", "fail": "false"}.get(mem.get("verdict", ""), ""),
        "gpu-utilization": ""
        if util.get("gpu_utilization_pct") is None
        else util["gpu_utilization_pct"],
        "coverage": "" if data["coverage"] is None else data["coverage"],
    }
    return values


def artifact_name(prefix: str, data: dict[str, Any]) -> str:
    """``prefix-class-jobid``: artifacts are immutable (upload-artifact v4), so matrix legs and
    re-runs each need their own name.

    >>> artifact_name("dlci", {"preflight": {"tier": {"hardware_class": "a100"}}})[:10]
    'dlci-a100-'
    """
    import re

    tier = (data.get("preflight") or {}).get("tier") or {}
    job = os.environ.get("DLCI_JOB_ID") or f"local-{os.getpid()}"
    name = f"{prefix}-{tier.get('hardware_class', 'unknown')}-{job}"
    return re.sub(r'[":<>|*?\\/\r\n]', "-", name)


def annotations(data: dict[str, Any]) -> list[tuple[str, str, str]]:
    out: list[tuple[str, str, str]] = []
    for problem in data["problems"]:
        out.append(("error", problem, "dl-ci"))
    tests = data["tests"]
    if tests:
        for case in tests["failed_cases"][:MAX_TEST_ANNOTATIONS]:
            oom = "out of memory" in case["message"].lower()
            title = "test ran out of memory" if oom else "test failed"
            out.append(("error", f"{case['name']}: {case['message']}", title))
    mem = data["memorization"]
    if mem and mem.get("verdict") == "fail":
        out.append(("error", mem.get("reason", "the memorization test failed"), "memorization"))
    doctor = data["doctor"]
    if doctor:
        for check in doctor.get("checks", []):
            if check.get("status") == "fail":
                out.append(("error", f"{check['id']}: {check.get('cause', '')}", "dlci doctor"))
    util = data["utilization"]
    if util and util.get("gate") and not util["gate"].get("passed"):
        out.append(("error", util["gate"]["message"], "GPU utilization"))
    return out


def render(data: dict[str, Any], *, title: str = "dl-ci") -> str:
    """The job summary in Markdown; the reports' own sections are reused as they are."""
    verdict = "passed" if data["verdict"] == "pass" else "FAILED"
    lines = [f"## {'✅' if data['verdict'] == 'pass' else '❌'} {title}: {verdict}", ""]
    for problem in data["problems"]:
        lines.append(f"- {problem}")
    if data["problems"]:
        lines.append("")
    pre = data["preflight"] or {}
    tier = pre.get("tier") or {}
    lines += ["| | |", "|---|---|"]
    if tier:
        lines.append(
            f"| tier | {tier.get('budget')} on {tier.get('hardware_class')}: up to "
            f"{tier.get('max_epochs')} epochs to loss < {tier.get('max_loss')}, "
            f"{tier.get('time_cap_minutes')} min, {tier.get('profile_steps')} profiled steps |"
        )
        lines.append(
            f"| hardware | {tier.get('hardware_class')}"
            + (" (GPU)" if pre.get("gpu") else " (CPU path)")
            + " |"
        )
    tests = data["tests"]
    if tests:
        lines.append(
            f"| tests | {tests['passed']} passed, {tests['failures']} failed, {tests['errors']} "
            f"errors, {tests['skipped']} skipped |"
        )
    if data["coverage"] is not None:
        lines.append(f"| coverage | {data['coverage']:.1f}% of lines |")
    mem = data["memorization"]
    if mem:
        loss = mem.get("best_loss")
        lines.append(
            f"| memorization | {mem.get('verdict', '?').upper()}: best loss "
            f"{loss if loss is None else f'{loss:.4g}'} (threshold {mem.get('threshold')}) |"
        )
    util = data["utilization"]
    if util:
        value = util.get("gpu_utilization_pct")
        lines.append(
            "| GPU utilization | "
            + ("CPU-only trace" if value is None else f"{value:.1f}%")
            + f" over {util.get('steps', {}).get('count', 0)} profiled steps |"
        )
    doctor = data["doctor"]
    if doctor:
        c = doctor.get("counts", {})
        lines.append(
            f"| debugging checks | {c.get('fail', 0)} failed, {c.get('warn', 0)} warnings, "
            f"{c.get('pass', 0)} passed |"
        )
    cleanup = data["cleanup"]
    if cleanup:
        lines.append(
            f"| cleanup | {cleanup.get('containers_removed', 0)} container(s) removed, "
            f"{cleanup.get('ownership_restored', 0)} file(s) given back, "
            f"{len(cleanup.get('gpu_processes', []))} GPU process(es) left |"
        )
    lines.append("")
    run = data["run"]
    if run:
        lines += ["### Steps", "", "| step | status | time |", "|---|---|---|"]
        for step in run.get("steps", []):
            status = step.get("status", "?")
            if status == "running":
                status = "interrupted"
            note = f" ({step['reason']})" if step.get("reason") else ""
            lines.append(
                f"| {step['name']} | {ICON.get(status, '')} {status}{note} | "
                f"{step.get('duration_s', 0):.1f} s |"
            )
        lines.append("")
    if tests and tests["failed_cases"]:
        lines += ["### Failed tests", ""]
        for case in tests["failed_cases"][:MAX_TEST_ANNOTATIONS]:
            lines.append(f"- `{case['name']}`: {case['message'][:200]}")
        lines.append("")
    if mem:
        from dlci.report.memorization import render_markdown as memorization_md

        try:
            lines.append(memorization_md(mem))
        except (KeyError, TypeError):
            lines.append("(memorization.json is incomplete)")
    if doctor:
        from dlci.report.doctor import render_markdown as doctor_md

        try:
            lines.append(doctor_md(doctor))
        except (KeyError, TypeError):
            lines.append("(doctor.json is incomplete)")
    if util:
        from dlci.report.utilization import render_markdown as utilization_md

        try:
            lines.append(utilization_md(util, gate=util.get("gate")))
        except (KeyError, TypeError):
            lines.append("(utilization.json is incomplete)")
    lines.append(
        "The loss curve, the trace (open it in Perfetto) and every report are in the job's "
        "artifacts."
    )
    return "\n".join(lines)
