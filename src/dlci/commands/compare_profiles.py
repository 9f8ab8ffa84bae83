"""``dlci compare-profiles`` (alias ``dlci diff``): compare two utilization reports."""

from __future__ import annotations

import argparse
import sys

from dlci.commands import _common
from dlci.commands._common import ArgumentParser
from dlci.commands.base import Verb
from dlci.compare import diff
from dlci.errors import DlciError
from dlci.fsutil import atomic_write_text
from dlci.report import diff_render, utilization
from dlci.report.console import print_warning
from dlci.report.fields import Utilization
from dlci.report.text import clean

VERB = "compare-profiles"


class CompareProfilesVerb(Verb):
    """Compare two UTILIZATION reports written by dlci analyze (alias: dlci diff; to compare
    two memorization runs, use dlci compare-runs). BASE is the main branch or last night, HEAD
    this change. Every profiled step of both runs is a sample: the change is the
    Hodges-Lehmann shift with its 95% interval. Exit 1 when the whole interval is beyond a
    bound (GPU utilization dropped by more than the bound in percentage points, or the step
    time grew by more than the bound in percent), and with --block-likely when the estimate
    is beyond it and the change is real (likely regressed); exit 0 with a warning when the
    runs cannot tell (too few steps, too much spread) or are not comparable (other GPU,
    hardware class or torch version)."""

    def add_options(self, p: ArgumentParser) -> None:
        p.add_argument("--block-likely", action="store_true", help="fail on a likely "
                       "regression too (the estimate beyond the bound, the change "
                       "real)")  # fmt: skip
        p.add_argument("base", metavar="BASE", help="utilization.json of the baseline (or its "
                       "folder)")  # fmt: skip
        p.add_argument("head", metavar="HEAD", help="utilization.json of the change (or its "
                       "directory)")  # fmt: skip
        p.add_argument("--max-regression", type=float, default=5.0, metavar="BOUND",
                       help="both bounds: points of utilization, percent of step time "
                       "(default: 5)")  # fmt: skip
        for name, unit in (
            ("utilization-drop", "percentage points"),
            ("step-time-regression", "percent"),
        ):
            p.add_argument(
                f"--max-{name}", type=float, metavar="BOUND", help=f"this bound alone ({unit})"
            )
        _common.add_json(p, "the comparison")
        p.add_argument(
            "--markdown", metavar="FILE", help="write the comparison as Markdown to FILE"
        )

    def run(self, args: argparse.Namespace) -> int:
        for value in (
            args.max_regression,
            args.max_utilization_drop,
            args.max_step_time_regression,
        ):
            if value is not None and not value >= 0:
                raise DlciError(f"a bound must be 0 or more, got {value:g}",
                                hint="for 5% write --max-regression 5")  # fmt: skip
        result = diff.compare(
            load_report(args.base),
            load_report(args.head),
            args.max_regression,
            max_utilization_drop=args.max_utilization_drop,
            max_step_time_regression=args.max_step_time_regression,
            block_likely=args.block_likely,
        )
        if not result.compared:
            raise DlciError(
                "nothing to compare: neither GPU utilization nor step time is in both reports",
                hint="compare reports of traces with ProfilerStep markers (dlci profile writes "
                "them)",
            )
        _write(result, args)
        if result.not_comparable or result.verdict in (
            "inconclusive", "not comparable", "likely regressed",
        ):  # fmt: skip
            why = "not comparable" if result.not_comparable else result.verdict
            print_warning(f"nothing was gated: the runs are {why} (see the notes; --block-likely "
                          "fails a likely regression)" if why == "likely regressed" else
                          f"nothing was gated: the runs are {why} (see the notes)")  # fmt: skip
        return 0 if result.passed else 1


def _write(result: diff.Diff, args: argparse.Namespace) -> None:
    """The table on the terminal, and each file asked for, named once written."""
    names = {"base": args.base, "head": args.head}
    if args.json:
        _common.emit_json(result, args.json)
    if args.json != "-":  # JSON on standard output stays parseable: nothing else goes there
        with _common.stdout_guard():
            diff_render.print_table(result, **names)
    log = sys.stderr if args.json == "-" else sys.stdout
    if args.json and args.json != "-":
        print(f"wrote {clean(args.json)}", file=log)
    if args.markdown:
        atomic_write_text(args.markdown, diff_render.render_markdown(result, **names))
        print(f"wrote {clean(args.markdown)}", file=log)


def load_report(location: str) -> Utilization:
    """Read a utilization report, or the one inside a directory, into its classes."""
    writer, check = "dlci analyze --json", utilization.check_compared
    data = _common.load_report(location, kind="utilization", name=utilization.REPORT_NAME,
                               writer=writer, check=check)  # fmt: skip
    try:
        return utilization.read(data)
    except ValueError as exc:  # the types are checked: a required field is missing
        raise DlciError(str(exc), hint=f"{writer} writes one", file=location) from None


main = CompareProfilesVerb(VERB).main
