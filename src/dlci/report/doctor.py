"""The doctor report: JSON first; the console table and the Markdown are made from it."""

from __future__ import annotations

import time
from dataclasses import asdict
from typing import Any

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


def build(results: list[Any], *, target: str, tier: dict[str, Any], seed: int) -> dict[str, Any]:
    """The doctor.json document for a list of check results.

    ``counts`` has one key per status, and ``ran``: the checks that ran to a status other
    than skip. A crashed check gives no evidence, so it fails the verdict (with a reason).
    """
    counts = {status: sum(r.status == status for r in results) for status in ICONS}
    counts["ran"] = len(results) - counts["skip"]
    crashed = [r.id for r in results if r.status == "crashed"]
    data: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "kind": "doctor",
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "target": target,
        "seed": seed,
        "tier": tier,
        "verdict": "fail" if counts["fail"] or crashed else "pass",
        "counts": counts,
        "checks": [asdict(r) for r in results],
    }
    if crashed:
        data["reason"] = f"checks crashed, so they gave no verdict: {', '.join(crashed)}"
    return data


def _tally(counts: dict[str, int]) -> str:
    """``1 failed, 0 warnings, 13 passed, 2 skipped: 14 of 16 checks ran``; older reports
    have no ``crashed`` or ``ran``."""
    crashed = counts.get("crashed", 0)
    total = sum(counts.get(status, 0) for status in ICONS)
    ran = counts.get("ran", total - counts.get("skip", 0))
    return (
        f"{counts.get('fail', 0)} failed, "
        + (f"{crashed} crashed, " if crashed else "")
        + f"{counts.get('warn', 0)} warnings, {counts.get('pass', 0)} passed, "
        f"{counts.get('skip', 0)} skipped: {ran} of {total} checks ran"
    )


def render_markdown(report: dict[str, Any]) -> str:
    """The job-summary section: one row per check; cause and fix for anything but pass."""
    head = "✅" if report["verdict"] == "pass" else "❌"
    rows = []
    for check in report["checks"]:
        advice = ""
        if check["status"] != "pass":
            advice = md(check["cause"]) + (f"; fix: {md(check['fix'])}" if check["fix"] else "")
        rows.append(
            [
                md_code(check["id"]),
                f"{ICONS.get(check['status'], '')} {md(check['status'])}",
                md(check["measured"]),
                md(check["expected"]),
                advice,
            ]
        )
    headers = ["check", "status", "measured", "expected", "cause and fix"]
    lines = [f"### {head} Debugging checks: {_tally(report['counts'])}", "", *table(headers, rows)]
    return "\n".join(lines) + "\n"


def print_table(report: dict[str, Any]) -> None:
    """The doctor's table on the terminal; outside text shown as plain text, never as markup."""
    from rich.table import Table
    from rich.text import Text

    from dlci.report.console import table_console

    grid = Table("check", "status", "measured", "expected", "cause / fix", title="dlci doctor")
    for check in report["checks"]:
        advice = ""
        if check["status"] != "pass":
            advice = clean(check["cause"]) + (
                f"\nfix: {clean(check['fix'])}" if check["fix"] else ""
            )
        grid.add_row(
            Text(clean(check["id"])),
            Text(clean(check["status"]), style=STYLES.get(check["status"], "")),
            Text(clean(check["measured"])),
            Text(clean(check["expected"])),
            Text(advice),
        )
    console = table_console()
    console.print(grid)
    console.print(_tally(report["counts"]), highlight=False)
