"""``dlci diff``: compare two utilization reports (a pull request against its base)."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from dlci.commands import _common
from dlci.errors import DlciError


def main(argv: Sequence[str]) -> int:
    p = _common.parser(
        "diff",
        "Compare two utilization reports written by dlci analyze (BASE: the main branch or "
        "last night; HEAD: this change). Fails when GPU utilization drops by more than the "
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

    from dlci.fsutil import atomic_write_text
    from dlci.report.utilization import compare, render_diff_markdown

    base, head = load_report(args.base), load_report(args.head)
    result = compare(base, head, args.max_regression)
    if not result["compared"]:
        raise DlciError(
            "nothing to compare: neither GPU utilization nor step time is in both reports",
            hint="compare reports of traces with ProfilerStep markers (dlci profile writes them)",
        )
    if args.json:
        _common.emit_json(result, args.json)
    text = render_diff_markdown(result)
    if args.markdown:
        atomic_write_text(args.markdown, text)
    if args.json != "-":
        print(text, file=sys.stderr if args.markdown else sys.stdout)
    return 0 if result["passed"] else 1


def load_report(location: str) -> dict[str, Any]:
    from dlci.report.utilization import REPORT_NAME

    return _common.load_report(
        location, kind="utilization", name=REPORT_NAME, writer="dlci analyze --json"
    )
