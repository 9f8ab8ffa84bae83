"""Two memorization runs compared, on the terminal (the comparison: dlci.compare.runs)."""

from __future__ import annotations

from typing import Any

from msgspec import UnsetType

from dlci.compare.runs import RunComparison
from dlci.report.console import table_console
from dlci.report.text import clean


def print_table(result: RunComparison, name_a: str, name_b: str) -> None:
    """The comparison as two tables on the terminal: what changed, and the results."""
    from rich.table import Table
    from rich.text import Text

    def grid(first: str, title: str) -> Table:
        table = Table(first, title=title)
        table.add_column(Text(clean(name_a)))  # a Text, so that a name is never read as markup
        table.add_column(Text(clean(name_b)))
        return table

    console = table_console()
    if result.changed:
        table = grid("configuration", "what changed")
        for key, change in result.changed.items():
            table.add_row(Text(clean(key)), Text(show(change.a)), Text(show(change.b)))
        console.print(table)
    else:
        console.print("configurations are identical: metric differences come from nondeterminism")
    table = grid("metric", "results")
    differences = any(
        not isinstance(side.difference, UnsetType) for side in result.metrics.values()
    )
    if differences:
        table.add_column("difference")
    for key, side in result.metrics.items():
        cells: list[str | Text] = [key, Text(show(side.a)), Text(show(side.b))]
        if differences:
            cells.append(
                Text(clean("" if isinstance(side.difference, UnsetType) else side.difference))
            )
        table.add_row(*cells)
    console.print(table)


def show(value: Any) -> str:
    """A value for a table cell, outside text made safe for the terminal.

    >>> show(0.123456), show(None), show("a\\x1b[31m")
    ('0.1235', '-', 'a\\\\x1b[31m')
    """
    if isinstance(value, float):
        return f"{value:.4g}"
    return "-" if value is None else clean(value)
