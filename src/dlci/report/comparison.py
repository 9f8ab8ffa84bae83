"""This run against its baseline, in Markdown: the job summary's section and the PR comment.

One table, base beside head, with an arrow and a verdict per figure; the notes say why a
figure is not ok; a Mermaid chart draws both memorization curves (GitHub renders Mermaid in
comments and summaries). Every name from a report goes through ``md``/``md_code``; the
chart holds numbers only.

The comparison is typed (:class:`Comparison`): dlci.action.github.baseline builds it, this
module renders its attributes, and msgspec writes it as ``dlci baseline --json``'s JSON.
"""

from __future__ import annotations

import re

import msgspec
from msgspec import UNSET, UnsetType

from dlci.compare.diff import Diff, change_of
from dlci.report import fields
from dlci.report.diff_render import cells, notes, shift_note
from dlci.report.fields import BaselineSource
from dlci.report.text import bullets, md, md_code, table

MARKER = "<!-- dl-ci baseline comparison -->"  # finds the sticky comment again
HEADERS = ["", "base", "head", "change", "verdict"]
CHART_POINTS = 60
ZERO = re.compile(r"[+-]?0(\.0+)?( |$)")  # a change shown as zero: "+0.0 pt", "+0", "-0 per step"
ICON = {
    "passed": "✅", "failed": "❌", "likely regressed": "⚠️", "inconclusive": "⚠️",
    "not comparable": "➖", "none": "➖",
}  # fmt: skip
TITLES = {
    "epochs_to_threshold": "memorization: epochs to threshold",
    "final_loss": "memorization: final loss",
    "coverage": "coverage",
}


class SideRow(msgspec.Struct, kw_only=True):
    """A figure shown side by side, not gated: memorization's, coverage's."""

    metric: str  # a key of TITLES
    base: float | None
    head: float | None
    change: float | None
    unit: str  # count, loss, percentage points
    verdict: str = "not gated"
    reason: str = ""


class Curves(msgspec.Struct, kw_only=True):
    base: list[float] = []
    head: list[float] = []


class LeftOut(msgspec.Struct, kw_only=True):
    base: list[str] = []
    head: list[str] = []


class Comparison(msgspec.Struct, kw_only=True):
    """This run against its baseline (schema_version 1, kind baseline-comparison)."""

    schema_version: int = 1
    kind: str = "baseline-comparison"
    memorization: list[SideRow] = []
    utilization: Diff | None = None
    coverage: list[SideRow] = []
    curves: Curves = msgspec.field(default_factory=Curves)
    left_out: LeftOut = msgspec.field(default_factory=LeftOut)
    warnings: list[str] = []
    verdict: str = "passed"  # passed, failed, likely regressed, inconclusive, not comparable
    passed: bool = True
    source: BaselineSource | UnsetType = UNSET  # where the baseline came from, once known


def read_source(raw: object) -> BaselineSource:
    """A decoded baseline-source.json (or a fetched run) as its class; ValueError naming each
    field of a wrong type.

    >>> read_source({"id": 7, "artifact": "dlci-a", "skipped": []}).id
    7
    >>> read_source({"id": 7, "head_sha": ["x"]})
    Traceback (most recent call last):
    ValueError: baseline-source.json: head_sha is a list, expected text or null
    """
    return fields.read_as("baseline-source", BaselineSource, raw)


def arrow(change: float | None) -> str:
    """Up, down or level, for a change.

    >>> arrow(2.0), arrow(-0.3), arrow(0.0), arrow(None)
    ('↑', '↓', '→', '')
    """
    if change is None:
        return ""
    return "↑" if change > 0 else "↓" if change < 0 else "→"


def _plain_cells(row: SideRow) -> list[str]:
    def show(value: float | None) -> str:
        if value is None:
            return "-"
        if row.unit == "count":
            return f"{value:.0f}"
        return f"{value:.1f} %" if row.unit == "percentage points" else f"{value:.4g}"

    change = row.change
    text = "-"
    if change is not None:
        text = {"count": f"{change:+.0f}", "loss": f"{change:+.3g}"}.get(
            row.unit, f"{change:+.1f} pt"
        )
    if row.metric == "epochs_to_threshold" and row.base is not None and row.head is None:
        text = "not reached"
    return [TITLES[row.metric], show(row.base), show(row.head), text, row.verdict]


def rows(result: Comparison) -> list[list[str]]:
    """The table's rows as Markdown cells."""
    out = []
    for row in result.memorization:
        out.append(_with_arrow(_plain_cells(row), row.change))
    for judged in result.utilization.rows if result.utilization is not None else []:
        out.append(_with_arrow(cells(judged), change_of(judged)))
    for row in result.coverage:
        out.append(_with_arrow(_plain_cells(row), row.change))
    return out


def _with_arrow(values: list[str], change: float | None) -> list[str]:
    name, base, head, delta, verdict = values
    if ZERO.match(delta):  # what rounds to zero is level, whatever its sign
        change = 0.0
    shown = f"{arrow(change)} {delta}".strip() if delta != "-" else delta
    marked = f"**{md(verdict)}**" if verdict in ("regressed", "likely regressed") else md(verdict)
    return [md(name), md(base), md(head), md(shown), marked]


def source_line(source: BaselineSource) -> str:
    """Where the baseline came from, in one Markdown line.

    >>> source_line(BaselineSource(id=7, head_sha="0123456789abcdef", artifact="dlci-a"))
    'base: run 7 at `0123456789ab`, artifact `dlci-a`'
    """
    if _known(source.folder):
        return f"base: the reports in {md_code(source.folder, limit=200)}"
    parts = [f"run {md(_known(source.id))}"]
    if _known(source.head_branch):
        parts.append(f"on {md_code(source.head_branch, limit=100)}")
    if _known(source.head_sha):
        parts.append(f"at {md_code(str(source.head_sha)[:12])}")
    if _known(source.created_at):
        parts.append(f"({md(source.created_at, limit=40)})")
    return "base: " + " ".join(parts) + f", artifact {md_code(_known(source.artifact) or '')}"


def _known(value: object) -> object:
    """A source's field, None when it is not known."""
    return None if isinstance(value, UnsetType) else value


def chart(base: list[float], head: list[float]) -> list[str]:
    """A Mermaid line chart of both memorization curves, thinned to CHART_POINTS each."""
    if not base or not head:
        return []
    length = max(len(base), len(head))
    step = max(1, -(-length // CHART_POINTS))
    xs = list(range(0, length, step))

    def line(values: list[float]) -> str:
        # a run that stopped early stays at its last loss
        picked = [values[min(x, len(values) - 1)] for x in xs]
        return "[" + ", ".join(f"{v:.4g}" for v in picked) + "]"

    return [
        "```mermaid",
        "xychart-beta",
        '  title "Memorization loss per step: base (first line), head (second)"',
        f'  x-axis "step" [{", ".join(str(x + 1) for x in xs)}]',
        '  y-axis "loss"',
        f"  line {line(base)}",
        f"  line {line(head)}",
        "```",
    ]


def render(result: Comparison, *, title: str = "dl-ci against the baseline") -> str:
    """The comparison's Markdown section (also the PR comment's body, after MARKER)."""
    verdict = result.verdict
    source = BaselineSource() if isinstance(result.source, UnsetType) else result.source
    lines = [MARKER, f"## {ICON.get(verdict, '')} {md(title)}: {verdict}", ""]
    lines += [source_line(source), ""]
    lines += [*table(HEADERS, rows(result), align="lrrrl"), ""]
    for line in shift_note(result.utilization) if result.utilization is not None else []:
        lines += [md(line), ""]
    found = [
        f"{TITLES[row.metric]}: {row.verdict}: {row.reason}"
        for row in result.memorization
        if row.reason
    ][:1]  # the rows share their reason
    found += notes(result.utilization) if result.utilization is not None else []
    found += result.warnings
    for side, left in (("base", result.left_out.base), ("head", result.left_out.head)):
        found += [f"{side}: left out {item}" for item in left]
    if found:
        lines += [*bullets(md(note) for note in found), ""]
    lines += chart(result.curves.base, result.curves.head)
    return "\n".join(lines) + "\n"


def render_none(reason: str, *, title: str = "dl-ci against the baseline") -> str:
    """The section when there is no baseline: why, and no table."""
    return f"{MARKER}\n## {ICON['none']} {md(title)}: no baseline\n\n{md(reason)}\n"
