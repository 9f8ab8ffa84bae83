"""What the job left in dlci-artifacts/, read back for the job summary, outputs and annotations.

Host-side (no torch). Reads preflight.json, run.json, cleanup.json, junit.xml, coverage.xml,
memorization.json, doctor.json and utilization.json, and reports on whatever is there: a job
that failed early still gets a summary of what ran.
"""

from __future__ import annotations

import contextlib
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dlci import jsonio

MAX_TEST_ANNOTATIONS = 20


@dataclass(frozen=True)
class Summary:
    """The job summary's Markdown, the step outputs, the annotations, and the verdict."""

    markdown: str
    outputs: dict[str, Any]
    annotations: list[tuple[str, str, str]]
    verdict: str


def summarize(folder: Path, *, title: str = "dl-ci", artifact_prefix: str = "") -> Summary:
    """Everything ``dlci summary`` reports on the artifacts in ``folder``."""
    from dlci.report.summary import render

    data = collect(folder)
    values = outputs(data)
    if artifact_prefix:
        values["artifact-name"] = artifact_name(artifact_prefix, data)
    return Summary(render(data, title=title), values, error_annotations(data), data["verdict"])


def _load(path: Path) -> dict[str, Any] | None:
    try:
        value = jsonio.decode(path.read_bytes())
    except (OSError, jsonio.DecodeError):
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
    data["problems"] = problems(data["preflight"], data["run"])
    data["verdict"] = "fail" if data["problems"] else "pass"
    return data


def problems(pre: dict[str, Any] | None, run: dict[str, Any] | None) -> list[str]:
    """What failed the job: a refused preflight, steps that did not run or did not pass.

    >>> problems({"passed": True}, {"steps": [{"name": "tests", "status": "failed"}]})
    ['step tests failed']
    """
    found: list[str] = []
    if pre is not None and not pre.get("passed"):
        found.append("preflight: " + str((pre.get("error") or {}).get("message", "failed")))
    if run is None:
        if pre is None or pre.get("passed"):
            found.append("the job's steps did not run (no run.json): see the job log")
        return found
    for step in run.get("steps", []):
        status = step.get("status")
        if status in ("failed", "error", "interrupted", "running"):
            how = "was interrupted" if status in ("interrupted", "running") else status
            reason = f" ({step['reason']})" if step.get("reason") else ""
            found.append(f"step {step.get('name', '?')} {how}{reason}")
    return found


def junit_counts(path: Path) -> dict[str, Any] | None:
    """Test counts and the failed cases of a JUnit XML file; None when there is none."""
    if not path.is_file():
        return None
    import xml.etree.ElementTree as ET

    try:
        root = ET.parse(path).getroot()  # noqa: S314 - pytest wrote it in this job
    except ET.ParseError:
        return None
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    counts: dict[str, Any] = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    for suite in suites:
        for key in ("tests", "failures", "errors", "skipped"):
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
    """The line coverage in percent from a coverage.py XML file; None when there is none."""
    if not path.is_file():
        return None
    import xml.etree.ElementTree as ET

    try:
        root = ET.parse(path).getroot()  # noqa: S314 - coverage.py wrote it in this job
        return round(100.0 * float(root.get("line-rate", "nan")), 2)
    except (ET.ParseError, ValueError):
        return None


def outputs(data: dict[str, Any]) -> dict[str, Any]:
    """The action's step outputs (GITHUB_OUTPUT) from the collected reports."""
    tier = (data["preflight"] or {}).get("tier") or {}
    mem = data["memorization"] or {}
    util = data["utilization"] or {}
    return {
        "verdict": data["verdict"],
        "hardware-class": tier.get("hardware_class", ""),
        "tier": jsonio.encode(tier, indent=False).decode() if tier else "",
        "memorization-loss": "" if mem.get("best_loss") is None else mem["best_loss"],
        "memorization-passed": {"pass": "true", "fail": "false"}.get(mem.get("verdict", ""), ""),
        "gpu-utilization": ""
        if util.get("gpu_utilization_pct") is None
        else util["gpu_utilization_pct"],
        "coverage": "" if data["coverage"] is None else data["coverage"],
    }


def artifact_name(prefix: str, data: dict[str, Any]) -> str:
    """``prefix-class-jobid``: artifacts are immutable (upload-artifact v4), so matrix legs and
    re-runs each need their own name.

    >>> artifact_name("dlci", {"preflight": {"tier": {"hardware_class": "a100"}}})[:10]
    'dlci-a100-'
    """
    tier = (data.get("preflight") or {}).get("tier") or {}
    job = os.environ.get("DLCI_JOB_ID") or f"local-{os.getpid()}"
    name = f"{prefix}-{tier.get('hardware_class', 'unknown')}-{job}"
    return re.sub(r'[":<>|*?\\/\r\n]', "-", name)


def error_annotations(data: dict[str, Any]) -> list[tuple[str, str, str]]:
    """``(level, message, title)`` of every ``::error`` annotation the job earns."""
    out: list[tuple[str, str, str]] = [("error", p, "dl-ci") for p in data["problems"]]
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
