"""``dlci history``: append a night to the history, plot the trends, flag drift.

Host-side (no torch). The history is a JSON file carried from night to night as an artifact
(``--previous auto`` fetches the newest finished night's that kept one through GitHub's
API with the job's token, ``actions: read``) or kept anywhere else (``--previous FILE``).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from dlci.commands import _common
from dlci.commands._common import ArgumentParser
from dlci.commands.base import Verb
from dlci.errors import DlciError
from dlci.report.console import print_warning
from dlci.report.text import clean


class HistoryVerb(Verb):
    """Append tonight's figures (GPU utilization, step time, epochs to threshold, coverage) to the
    history, write history.json, trend.svg and history.md to --out, and flag drift: the last 3
    nights against the 14 before, per hardware class, with the statistics of dlci compare-profiles.
    Exit 0 unless --fail-on-drift and a figure drifted beyond its bound."""

    def add_options(self, p: ArgumentParser) -> None:
        p.add_argument("--previous", default="none", help="auto (the newest finished push, "
                       "schedule or workflow_dispatch run of this workflow on this branch that "
                       "kept the history artifact), none, or a history.json file")  # fmt: skip
        p.add_argument("--append", metavar="DIR", help="tonight's reports (dlci-artifacts); "
                       "if omitted, none added")  # fmt: skip
        p.add_argument("--out", default="dlci-history", metavar="DIR")
        p.add_argument(
            "--artifact-name",
            default="dlci-history",
            metavar="NAME",
            help="with --previous auto: the history artifact's name (or the start of it)",
        )
        for name, default, unit in (
            ("utilization-drop", 5.0, "percentage points"),
            ("step-time-regression", 5.0, "percent"),
            ("epochs-increase", 25.0, "percent"),
        ):
            p.add_argument(f"--max-{name}", type=float, default=default, metavar="BOUND",
                           help=f"drift bound in {unit} (default: {default:g})")  # fmt: skip
        p.add_argument("--fail-on-drift", action="store_true", help="exit 1 when a figure drifted")
        p.add_argument(
            "--markdown",
            metavar="FILE",
            default=os.environ.get("GITHUB_STEP_SUMMARY") or None,
            help="append the history's section to FILE (default: $GITHUB_STEP_SUMMARY, else none)",
        )

    def run(self, args: argparse.Namespace) -> int:
        bounds = {
            "gpu_utilization_pct": args.max_utilization_drop,
            "step_time_us": args.max_step_time_regression,
            "epochs_to_threshold": args.max_epochs_increase,
        }
        if any(not value >= 0 for value in bounds.values()):
            raise DlciError("a drift bound must be 0 or more", hint="for 5% write 5")
        from dlci.action.github.history import update  # numpy: off `dlci history --help`

        done = update(
            previous_spec=args.previous,
            artifacts=Path(args.append) if args.append else None,
            out=Path(args.out),
            token=os.environ.get("DLCI_GITHUB_TOKEN") or os.environ.get("GITHUB_TOKEN") or "",
            artifact=args.artifact_name,
            bounds=bounds,
        )
        if args.markdown:
            _common.append_to(args.markdown, done.markdown)
        for path in done.written:
            print(f"history: wrote {clean(path)}", file=sys.stderr)
        for warning in [*done.warnings, *done.drift]:
            print_warning(warning)
        return 1 if done.drift and args.fail_on_drift else 0


main = HistoryVerb("history").main
