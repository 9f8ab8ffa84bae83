"""``dlci compare-runs`` (alias ``dlci compare``): what differs between two memorization runs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dlci.commands import _common

VERB = "compare-runs"
ALIAS = "compare"


def main(argv: Sequence[str]) -> int:
    p = _common.parser(
        VERB,
        f"Compare two MEMORIZATION runs written by dlci memorize (alias: dlci {ALIAS}; to "
        "compare two utilization reports, use dlci compare-profiles): list the configuration "
        "values that differ and the metrics side by side, with how RUN_B differs. Warns when "
        "more than one configuration value changed (such a comparison cannot tell which change "
        "mattered), and when the runs are not comparable: another hardware class, GPU, device "
        "or torch version.",
    )
    p.add_argument("run_a", metavar="RUN_A", help="a memorization.json, or a directory holding one")
    p.add_argument("run_b", metavar="RUN_B", help="the run to compare against RUN_A")
    _common.add_json(p, "the comparison")
    args = p.parse_args(list(argv))

    from dlci.compare import runs
    from dlci.report.runs import print_table

    result = runs.compare(load_run(args.run_a), load_run(args.run_b))
    if args.json:
        _common.emit_json(result, args.json)
    else:
        with _common.stdout_guard():
            print_table(result, args.run_a, args.run_b)
    from dlci.report.console import print_warning

    for warning in result["warnings"]:
        print_warning(warning)
    return 0


def load_run(location: str) -> dict[str, Any]:
    """Read a memorization report, or the one inside a directory."""
    from dlci.compare.runs import check_run
    from dlci.report.memorization import REPORT_NAME

    return _common.load_report(
        location, kind="memorization", name=REPORT_NAME, writer="dlci memorize", check=check_run
    )
