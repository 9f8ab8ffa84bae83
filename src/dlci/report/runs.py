"""Two memorization runs compared, on the terminal (the comparison: dlci.compare.runs)."""

from __future__ import annotations

from typing import Any

from dlci.report.console import table_console
from dlci.report.text import clean


def print_table(result: dict[str, Any], name_a: str, name_b: str) -> None:
    """The comparison as two tables on the terminal: what changed, and the results."""
    from rich.table import Table
    from rich.text import Text

    def grid(first: str, title: str) -> Table:
        table = Table(first, title=title)
        table.add_column(Text(clean(name_a)))  # a Text, so that a name is never read as markup
        table.add_column(Text(clean(name_b)))
        return table

    console = table_console()
    if result["changed"]:
        table = grid("configuration", "what changed")
        for key, pair in result["changed"].items():
            table.add_row(Text(clean(key)), Text(show(pair["a"])), Text(show(pair["b"])))
        console.print(table)
    else:
        console.print("configurations are identical: metric differences come from nondeterminism")
    table = grid("metric", "results")
    differences = any("difference" in pair for pair in result["metrics"].values())
    if differences:
        table.add_column("difference")
    for key, pair in result["metrics"].items():
        cells = [key, Text(show(pair["a"])), Text(show(pair["b"]))]
        if differences:
            cells.append(Text(clean(pair.get("difference", ""))))
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
