"""The tests' files: JUnit XML counts and failed cases, coverage.py's line rate.

Host-side (no torch) and in the container; each file is outside input (the pull request's
tests wrote it): read as a stream, under caps, None when missing or broken.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

MAX_FAILED_CASES = 200  # kept from junit.xml (the summary shows fewer)


def junit_counts(path: Path) -> dict[str, Any] | None:
    """Test counts and the failed cases of a JUnit XML file; None when there is none.

    Read as a stream (each test case dropped once read), so a huge file from the pull
    request's tests costs its parse time, not its tree; the first MAX_FAILED_CASES failed
    cases are kept. Expat refuses entity bombs (None: unreadable).
    """
    if not path.is_file():
        return None
    import xml.etree.ElementTree as ET

    counts: dict[str, Any] = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    failed: list[dict[str, str]] = []
    depth, root_is_suite = 0, False
    try:
        for event, elem in ET.iterparse(path, events=("start", "end")):  # noqa: S314
            if event == "start":
                root_is_suite = root_is_suite or (depth == 0 and elem.tag == "testsuite")
                if elem.tag == "testsuite" and (depth == 0 or not root_is_suite):
                    for key in ("tests", "failures", "errors", "skipped"):
                        with contextlib.suppress(ValueError):
                            counts[key] += int(elem.get(key, 0))
                depth += 1
                continue
            depth -= 1
            if elem.tag == "testcase":
                if len(failed) < MAX_FAILED_CASES:
                    _failed_case(elem, failed)
                elem.clear()
    except ET.ParseError:
        return None
    counts["passed"] = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    counts["failed_cases"] = failed
    return counts


def _failed_case(case: Any, failed: list[dict[str, str]]) -> None:
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
