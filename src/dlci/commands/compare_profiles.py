"""``dlci compare-profiles`` (alias ``dlci diff``): compare two utilization reports."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from dlci.commands import _common
from dlci.errors import DlciError

VERB = "compare-profiles"
ALIAS = "diff"


def main(argv: Sequence[str]) -> int:
    p = _common.parser(
        VERB,
        f"Compare two UTILIZATION reports written by dlci analyze (alias: dlci {ALIAS}; to "
        "compare two memorization runs, use dlci compare-runs). BASE is the main branch or "
        "last night, HEAD this change. Fails when GPU utilization drops by more than the "
        "bound in percentage points, or the mean step time grows by more than the bound in "
        "percent.",
    )
    p.add_argument(
        "base", metavar="BASE", help="utilization.json of the baseline (or its directory)"
    )
    p.add_argument("head", metavar="HEAD", help="utilization.json of the change (or its directory)")
    p.add_argument(
        "--max-regression",
        type=float,
        default=5.0,
        metavar="PCT",
        help="the allowed regression: percentage points of utilization, percent of step "
        "time (default: 5)",
    )
    _common.add_json(p, "the comparison")
    p.add_argument("--markdown", metavar="FILE", help="write the comparison as Markdown to FILE")
    args = p.parse_args(list(argv))
    if not args.max_regression >= 0:
        raise DlciError(
            f"--max-regression must be 0 or more, got {args.max_regression:g}",
            hint="for 5% write --max-regression 5",
        )

    from dlci.report import diff

    result = diff.compare(load_report(args.base), load_report(args.head), args.max_regression)
    if not result["compared"]:
        raise DlciError(
            "nothing to compare: neither GPU utilization nor step time is in both reports",
            hint="compare reports of traces with ProfilerStep markers (dlci profile writes them)",
        )
    _write(result, args)
    return 0 if result["passed"] else 1


def _write(result: dict[str, Any], args: argparse.Namespace) -> None:
    """The table on the terminal, and each file asked for, named once written."""
    from dlci.fsutil import atomic_write_text
    from dlci.report import diff
    from dlci.report.text import clean

    names = {"base": args.base, "head": args.head}
    if args.json:
        _common.emit_json(result, args.json)
    if args.json != "-":  # JSON on standard output stays parseable: nothing else goes there
        with _common.stdout_guard():
            diff.print_table(result, **names)
    log = sys.stderr if args.json == "-" else sys.stdout
    if args.json and args.json != "-":
        print(f"wrote {clean(args.json)}", file=log)
    if args.markdown:
        atomic_write_text(args.markdown, diff.render_markdown(result, **names))
        print(f"wrote {clean(args.markdown)}", file=log)


def load_report(location: str) -> dict[str, Any]:
    """Read a utilization report, or the one inside a directory."""
    from dlci.report.diff import check_report
    from dlci.report.utilization import REPORT_NAME

    return _common.load_report(
        location,
        kind="utilization",
        name=REPORT_NAME,
        writer="dlci analyze --json",
        check=check_report,
    )
