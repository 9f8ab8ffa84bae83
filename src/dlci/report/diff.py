"""Two utilization reports compared: the result's JSON, its Markdown and its console table.

Every change carries its unit: utilization shares change in percentage points (``pt``),
the mean step time in percent of BASE's (``%``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dlci.report.text import clean, md, md_code, table

SCHEMA_VERSION = 1
KIND = "utilization-diff"
HEADERS = ["metric", "base", "head", "change", "status"]


@dataclass(frozen=True)
class Metric:
    """One compared figure: where it is in a report, how it is shown, how it changes."""

    key: str
    title: str
    unit: str  # the JSON's word for the change: "percentage points", "percent", "informational"
    change_suffix: str  # what the console and Markdown write after the change
    value: Callable[[dict[str, Any]], float | None]
    show: Callable[[float], str]


def _get(report: dict[str, Any], *path: str) -> float | None:
    node: Any = report
    for key in path:
        node = node.get(key) if isinstance(node, dict) else None
    return None if node is None else float(node)


def _ms(us: float) -> str:
    return f"{us / 1e3:.2f} ms"


def _pct(value: float) -> str:
    return f"{value:.1f} %"


METRICS = (
    Metric(
        "gpu_utilization_pct",
        "GPU utilization",
        "percentage points",
        "pt",
        lambda r: _get(r, "gpu_utilization_pct"),
        _pct,
    ),
    Metric(
        "mean_step_us",
        "mean step time",
        "percent",
        "%",
        lambda r: _get(r, "steps", "mean_step_us") or None,  # 0 means no steps
        _ms,
    ),
    Metric(
        "data_loading_pct",
        "data loading share",
        "informational",
        "pt",
        lambda r: _get(r, "phases", "pct", "data_loading"),
        _pct,
    ),
    Metric(
        "syncs_per_step",
        "blocking syncs per step",
        "informational",
        "per step",
        lambda r: _get(r, "syncs", "per_step"),
        lambda v: f"{v:g}",
    ),
)
BY_KEY = {metric.key: metric for metric in METRICS}
# the fields compare reads, with the range a report dl-ci wrote keeps them in
FIELDS = (
    (("gpu_utilization_pct",), 0.0, 100.0),
    (("steps", "mean_step_us"), 0.0, 1e18),
    (("phases", "pct", "data_loading"), 0.0, 100.0),
    (("syncs", "per_step"), 0.0, 1e18),
)


def describe(value: Any) -> str:
    """A value from a file, briefly, for a message: never huge, never a deep repr.

    >>> describe("x"), describe([1, 2]), describe(10**400), describe(True), describe(2.5)
    ("'x'", 'a list', 'an integer beyond 64 bits', 'true', '2.5')
    """
    if isinstance(value, bool) or value is None:
        return {True: "true", False: "false", None: "null"}[value]
    if isinstance(value, int) and abs(value) >= 2**63:
        return "an integer beyond 64 bits"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return repr(value[:40]) + ("..." if len(value) > 40 else "")
    return "an object" if isinstance(value, dict) else f"a {type(value).__name__}"


def check_report(report: dict[str, Any]) -> str | None:
    """What is wrong with a field :func:`compare` reads, or None; a missing field or null
    is fine (the figure is left out).

    >>> check_report({"steps": {"mean_step_us": "x"}})
    "steps.mean_step_us: expected a number, got 'x'"
    >>> check_report({"phases": []})
    'phases: expected an object, got a list'
    >>> check_report({"gpu_utilization_pct": 250})
    'gpu_utilization_pct: expected a number from 0 to 100, got 250'
    """
    for path, low, high in FIELDS:
        node: Any = report
        for depth, key in enumerate(path):
            if not isinstance(node, dict):
                return f"{'.'.join(path[:depth])}: expected an object, got {describe(node)}"
            node = node.get(key)
            if node is None:
                break
        else:
            where = ".".join(path)
            if isinstance(node, bool) or not isinstance(node, int | float):
                return f"{where}: expected a number, got {describe(node)}"
            if not low <= node <= high:  # NaN too
                return f"{where}: expected a number from {low:g} to {high:g}, got {describe(node)}"
    return None


def _row(metric: Metric, base: float, head: float, max_regression: float) -> dict[str, Any]:
    if metric.unit == "percent":
        change = 100.0 * (head - base) / base
        regressed = change > max_regression
    else:
        change = head - base
        regressed = metric.unit == "percentage points" and -change > max_regression
    return {
        "metric": metric.key,
        "base": base,
        "head": head,
        "change": round(change, 4),
        "unit": metric.unit,
        "regressed": regressed,
    }


def compare(base: dict[str, Any], head: dict[str, Any], max_regression: float) -> dict[str, Any]:
    """What got worse from BASE to HEAD, and whether it is beyond the bound.

    Utilization is compared in percentage points, step time in percent of BASE's.

    >>> base = {"gpu_utilization_pct": 80.0, "steps": {"mean_step_us": 1000.0}}
    >>> head = {"gpu_utilization_pct": 70.0, "steps": {"mean_step_us": 1020.0}}
    >>> result = compare(base, head, 5.0)
    >>> result["passed"], [r["metric"] for r in result["regressions"]]
    (False, ['gpu_utilization_pct'])
    """
    rows = []
    for metric in METRICS:
        b, h = metric.value(base), metric.value(head)
        if b is not None and h is not None and (metric.unit != "percent" or b > 0 < h):
            rows.append(_row(metric, b, h, max_regression))
    regressions = [row for row in rows if row["regressed"]]
    return {
        "schema_version": SCHEMA_VERSION,
        "kind": KIND,
        "max_regression": max_regression,
        "compared": sum(row["unit"] != "informational" for row in rows),
        "passed": not regressions,
        "rows": rows,
        "regressions": regressions,
    }


def cells(row: dict[str, Any]) -> list[str]:
    """One result row as plain strings: title, base, head, change with its unit, status.

    >>> cells({"metric": "mean_step_us", "base": 53580.0, "head": 55240.0, "change": 3.098,
    ...        "unit": "percent", "regressed": False})
    ['mean step time', '53.58 ms', '55.24 ms', '+3.1 %', 'ok']
    """
    metric = BY_KEY.get(row["metric"])
    if metric is None:  # a metric this dl-ci does not know: show it as it is
        return [row["metric"], f"{row['base']:g}", f"{row['head']:g}", f"{row['change']:+g}", ""]
    status = "regressed" if row["regressed"] else "ok"
    if metric.unit == "informational":
        status = "not gated"
    change = f"{row['change']:+.1f} {metric.change_suffix}"
    if metric.key == "syncs_per_step":
        change = f"{row['change']:+g} {metric.change_suffix}"
    return [metric.title, metric.show(row["base"]), metric.show(row["head"]), change, status]


def _title(result: dict[str, Any]) -> str:
    verdict = "passed" if result["passed"] else "FAILED"
    bound = result["max_regression"]
    return (
        f"Utilization diff {verdict} (bound: {bound:g} pt of GPU utilization, "
        f"{bound:g} % of step time)"
    )


def render_markdown(result: dict[str, Any], *, base: str = "", head: str = "") -> str:
    """The comparison as a Markdown section; ``base`` and ``head`` name the two reports."""
    rows = []
    for row in result["rows"]:
        title, b, h, change, status = cells(row)
        status = "**regressed**" if status == "regressed" else status
        rows.append([md(title), b, h, change, status])
    lines = [f"### {_title(result)}", ""]
    if base or head:
        lines += [f"base: {md_code(base)}, head: {md_code(head)}", ""]
    return "\n".join([*lines, *table(HEADERS, rows, align="lrrrl"), ""])


def print_table(result: dict[str, Any], *, base: str = "", head: str = "") -> None:
    """The comparison as a table on the terminal (standard output)."""
    from rich.table import Table
    from rich.text import Text

    from dlci.report.console import table_console

    grid = Table(title=_title(result), title_justify="left")
    for header in HEADERS:
        grid.add_column(header, justify="left" if header in ("metric", "status") else "right")
    styles = {"regressed": "bold red", "ok": "green", "not gated": "dim"}
    for row in result["rows"]:
        values = cells(row)
        grid.add_row(
            *(Text(clean(v)) for v in values[:4]), Text(values[4], style=styles.get(values[4], ""))
        )
    console = table_console()
    if base or head:
        console.print(Text(f"base: {clean(base)}\nhead: {clean(head)}"))
    console.print(grid)
