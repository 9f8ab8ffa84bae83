"""The doctor report: JSON first; the console table and the Markdown are made from it."""

from __future__ import annotations

import time
from dataclasses import asdict
from typing import Any

SCHEMA_VERSION = 1
REPORT_NAME = "doctor.json"
ICONS = {"pass": "✅", "warn": "⚠️", "fail": "❌", "skip": "⏭️"}


def build(results: list[Any], *, target: str, tier: dict[str, Any], seed: int) -> dict[str, Any]:
    counts = {status: sum(r.status == status for r in results) for status in ICONS}
    return {
        "schema_version": SCHEMA_VERSION,
        "kind": "doctor",
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "target": target,
        "seed": seed,
        "tier": tier,
        "verdict": "fail" if counts["fail"] else "pass",
        "counts": counts,
        "checks": [asdict(r) for r in results],
    }


def render_markdown(report: dict[str, Any]) -> str:
    """The job-summary section: one row per check; cause and fix for anything but pass."""
    counts = report["counts"]
    head = "✅" if report["verdict"] == "pass" else "❌"
    lines = [
        f"### {head} Debugging checks: {counts['fail']} failed, {counts['warn']} warnings, "
        f"{counts['pass']} passed, {counts['skip']} skipped",
        "",
        "| check | status | measured | expected | cause and fix |",
        "|---|---|---|---|---|",
    ]
    for check in report["checks"]:
        advice = f"{check['cause']}; fix: {check['fix']}" if check["fix"] else check["cause"]
        cells = [
            f"`{check['id']}`",
            f"{ICONS[check['status']]} {check['status']}",
            check["measured"],
            check["expected"],
            advice if check["status"] != "pass" else "",
        ]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines) + "\n"


def print_table(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    styles = {"pass": "green", "warn": "yellow", "fail": "bold red", "skip": "dim"}
    table = Table("check", "status", "measured", "expected", "cause / fix", title="dlci doctor")
    for check in report["checks"]:
        advice = ""
        if check["status"] != "pass":
            advice = check["cause"] + (f"\nfix: {check['fix']}" if check["fix"] else "")
        table.add_row(
            check["id"],
            f"[{styles[check['status']]}]{check['status']}[/]",
            check["measured"],
            check["expected"],
            advice,
        )
    import sys

    console = Console(width=None if sys.stdout.isatty() else 160)  # CI logs are wide
    console.print(table)
    counts = report["counts"]
    console.print(
        f"{counts['fail']} failed, {counts['warn']} warnings, {counts['pass']} passed, "
        f"{counts['skip']} skipped",
        highlight=False,
    )
