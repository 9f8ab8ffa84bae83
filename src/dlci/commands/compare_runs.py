"""``dlci compare-runs`` (alias ``dlci compare``): what differs between two memorization runs."""

from __future__ import annotations

import argparse
from typing import Any

from dlci.commands import _common
from dlci.commands._common import ArgumentParser
from dlci.commands.base import Verb
from dlci.compare import runs
from dlci.report.console import print_warning
from dlci.report.memorization import REPORT_NAME
from dlci.report.runs import print_table

VERB = "compare-runs"


class CompareRunsVerb(Verb):
    """Compare two MEMORIZATION runs written by dlci memorize (alias: dlci compare; to compare
    two utilization reports, use dlci compare-profiles): list the configuration values that
    differ and the metrics side by side, with how RUN_B differs. Warns when more than one
    configuration value changed (such a comparison cannot tell which change mattered), and
    when the runs are not comparable: another hardware class, GPU, device or torch version."""

    def add_options(self, p: ArgumentParser) -> None:
        p.add_argument(
            "run_a", metavar="RUN_A", help="a memorization.json, or a directory holding one"
        )
        p.add_argument("run_b", metavar="RUN_B", help="the run to compare against RUN_A")
        _common.add_json(p, "the comparison")

    def run(self, args: argparse.Namespace) -> int:
        result = runs.compare(load_run(args.run_a), load_run(args.run_b))
        if args.json:
            _common.emit_json(result, args.json)
        else:
            with _common.stdout_guard():
                print_table(result, args.run_a, args.run_b)
        for warning in result.warnings:
            print_warning(warning)
        return 0


def load_run(location: str) -> dict[str, Any]:
    """Read a memorization report, or the one inside a directory."""
    return _common.load_report(
        location,
        kind="memorization",
        name=REPORT_NAME,
        writer="dlci memorize",
        check=runs.check_run,
    )


main = CompareRunsVerb(VERB).main
