"""Two utilization reports compared (:mod:`dlci.compare.diff`): the console table and Markdown.

Every change carries its unit (``pt``: percentage points, ``%``: percent of BASE's) and, for
the gated figures, its 95% interval in brackets.
"""

from __future__ import annotations

from dlci.compare.diff import BY_KEY, Diff, PlainRow, Row, change_of
from dlci.report.console import table_console
from dlci.report.text import bullets, clean, md, md_code, table

HEADERS = ["metric", "base", "head", "change [95% interval]", "verdict"]
SUFFIX = {"percentage points": "pt", "percent": "%", "per step": "per step"}
SHIFT = (
    "a change with an interval is the Hodges-Lehmann shift (the median of every head-minus-base "
    "step difference), not the difference of the base and head shown"
)


def shift_note(result: Diff) -> list[str]:
    """The line under the table that says what a change with an interval is, when one is."""
    return [SHIFT] if any(_has_low(row) for row in result.rows) else []


def _has_low(row: Row) -> bool:
    return not isinstance(row, PlainRow) and isinstance(row.low, float | int)


def change_text(row: Row) -> str:
    """The change with its unit, and its interval when there is one.

    >>> from dlci.compare.diff import JudgedRow
    >>> change_text(JudgedRow(metric="step_time_us", base=1.0, head=1.0, unit="percent",
    ...                       verdict="ok", change=3.098, low=1.2, high=4.91))
    '+3.1 % [+1.2, +4.9]'
    >>> change_text(PlainRow(metric="syncs_per_step", base=1, head=2, unit="per step", change=1.0))
    '+1 per step'
    >>> change_text(PlainRow(metric="x", base=None, head=1, unit="percentage points", change=None))
    '-'
    """
    change = change_of(row)
    if change is None:
        return "-"
    suffix = SUFFIX.get(row.unit, "")
    text = f"{change:+g} {suffix}" if row.unit == "per step" else f"{signed(change)} {suffix}"
    interval = row.interval()
    if interval is not None:
        text += f" [{signed(interval[0])}, {signed(interval[1])}]"
    return text


def signed(value: float) -> str:
    """A change to one decimal with its sign; a change that rounds to zero is +0.0.

    >>> signed(-0.04), signed(2.25)
    ('+0.0', '+2.2')
    """
    return f"{round(value, 1) or 0.0:+.1f}"


def cells(row: Row) -> list[str]:
    """One result row as plain strings: title, base, head, change, verdict.

    >>> from dlci.compare.diff import JudgedRow
    >>> cells(JudgedRow(metric="step_time_us", base=53580.0, head=55240.0, change=3.098,
    ...                 low=1.2, high=4.9, unit="percent", verdict="ok"))
    ['step time (median)', '53.58 ms', '55.24 ms', '+3.1 % [+1.2, +4.9]', 'ok']
    """
    metric = BY_KEY.get(row.metric)
    if metric is None:  # a metric this dl-ci does not know: show it as it is
        return [str(row.metric), f"{row.base}", f"{row.head}", change_text(row), ""]

    def show(value: float | None) -> str:
        return "-" if value is None else metric.show(value)

    return [metric.title, show(row.base), show(row.head), change_text(row), row.verdict]


def title(result: Diff) -> str:
    """The heading: the verdict and the bounds it was judged against."""
    verdict = {"failed": "FAILED"}
    util, step = result.bounds.utilization_drop_pt, result.bounds.step_time_regression_pct
    util_text = "GPU utilization not gated" if util is None else f"{util:g} pt of GPU utilization"
    step_text = "step time not gated" if step is None else f"{step:g} % of step time"
    word = verdict.get(result.verdict, result.verdict)
    return f"Utilization diff {word} (bounds: {util_text}, {step_text})"


def notes(result: Diff) -> list[str]:
    """Why a figure is not ok, one line each (outside text: the caller escapes it)."""
    found = [
        f"{cells(row)[0]}: {row.verdict}: {row.reason}"
        for row in result.rows
        if row.verdict in ("regressed", "inconclusive", "not comparable") and row.reason
    ]
    return found


def render_markdown(result: Diff, *, base: str = "", head: str = "") -> str:
    """The comparison as a Markdown section; ``base`` and ``head`` name the two reports."""
    rows = []
    for row in result.rows:
        name, b, h, change, verdict = cells(row)
        verdict = "**regressed**" if verdict == "regressed" else verdict
        rows.append([md(name), b, h, change, verdict])
    lines = [f"### {title(result)}", ""]
    if base or head:
        lines += [f"base: {md_code(base)}, head: {md_code(head)}", ""]
    lines += [*table(HEADERS, rows, align="lrrrl"), ""]
    for line in shift_note(result):
        lines += [md(line), ""]
    found = notes(result)
    if found:
        lines += [*bullets(md(note) for note in found), ""]
    return "\n".join(lines)


def print_table(result: Diff, *, base: str = "", head: str = "") -> None:
    """The comparison as a table on the terminal (standard output)."""
    from rich.table import Table
    from rich.text import Text

    grid = Table(title=title(result), title_justify="left")
    for header in HEADERS:
        grid.add_column(header, justify="left" if header in ("metric", "verdict") else "right")
    styles = {
        "regressed": "bold red",
        "ok": "green",
        "inconclusive": "yellow",
        "not comparable": "yellow",
        "not gated": "dim",
    }
    for row in result.rows:
        values = cells(row)
        grid.add_row(
            *(Text(clean(v)) for v in values[:4]), Text(values[4], style=styles.get(values[4], ""))
        )
    console = table_console()
    if base or head:
        console.print(Text(f"base: {clean(base)}\nhead: {clean(head)}"))
    console.print(grid)
    for note in shift_note(result) + notes(result):
        console.print(Text(clean(note)))
