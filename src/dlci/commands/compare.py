"""``dlci compare``: what differs between two memorization runs, configuration and metrics."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dlci.commands import _common

METRICS = ("verdict", "best_loss", "best_step", "final_loss", "steps", "wall_time_s")


def main(argv: Sequence[str]) -> int:
    p = _common.parser(
        "compare",
        "List what differs between two memorization runs (their configurations and metrics). "
        "Warns when more than one configuration value changed: such a comparison cannot tell "
        "which change mattered.",
    )
    p.add_argument("run_a", metavar="RUN_A", help="a memorization.json, or a directory holding one")
    p.add_argument("run_b", metavar="RUN_B", help="the run to compare against RUN_A")
    _common.add_json(p, "the comparison")
    args = p.parse_args(list(argv))

    a, b = load_run(args.run_a), load_run(args.run_b)
    result = compare(a, b)
    if args.json:
        _common.emit_json(result, args.json)
    else:
        _print(result, args.run_a, args.run_b)
    if result["warning"]:
        from dlci.report.console import print_warning

        print_warning(result["warning"])
    return 0


def load_run(location: str) -> dict[str, Any]:
    """Read a memorization report, or the one inside a directory."""
    from dlci.report.memorization import REPORT_NAME

    return _common.load_report(
        location, kind="memorization", name=REPORT_NAME, writer="dlci memorize"
    )


def compare(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """The differing configuration values, the metrics side by side, and a warning if due."""
    from dlci.memorization.tracking import flatten

    config_a, config_b = flatten(a["config"]), flatten(b["config"])
    changed = {
        key: {"a": config_a.get(key), "b": config_b.get(key)}
        for key in sorted(set(config_a) | set(config_b))
        if config_a.get(key) != config_b.get(key)
    }
    metrics = {key: {"a": a.get(key), "b": b.get(key)} for key in METRICS}
    warning = ""
    if len(changed) > 1:
        warning = (
            f"{len(changed)} configuration values differ ({', '.join(changed)}): this comparison "
            "cannot tell which change mattered; change one thing at a time"
        )
    return {
        "schema_version": 1,
        "kind": "comparison",
        "changed": changed,
        "metrics": metrics,
        "warning": warning,
    }


def _print(result: dict[str, Any], name_a: str, name_b: str) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    if result["changed"]:
        table = Table("configuration", name_a, name_b, title="what changed")
        for key, pair in result["changed"].items():
            table.add_row(key, _show(pair["a"]), _show(pair["b"]))
        console.print(table)
    else:
        console.print("configurations are identical: metric differences come from nondeterminism")
    table = Table("metric", name_a, name_b, title="results")
    for key, pair in result["metrics"].items():
        table.add_row(key, _show(pair["a"]), _show(pair["b"]))
    console.print(table)


def _show(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "-" if value is None else str(value)
