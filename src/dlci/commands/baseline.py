"""``dlci baseline``: this run's reports against a baseline run's, in the job summary.

Host-side (no torch). The baseline is fetched through GitHub's REST API with the job's token
(``actions: read``), or read from a folder (``--base-dir``). A missing or unreadable baseline
is a warning; exit 1 only when a bound is exceeded with 95% confidence.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from dlci.action.github.bounds import parse_bound as _bound
from dlci.commands import _common
from dlci.commands._common import ArgumentParser
from dlci.commands.base import Verb
from dlci.errors import DlciError
from dlci.report.text import clean


class BaselineVerb(Verb):
    """Compare this run's reports (the summary step's verified copy) with a baseline run's:
    memorization, GPU utilization and step time (with their 95% intervals), data loading, syncs and
    coverage side by side, in the job summary. Exit 1 only when a bound is exceeded with confidence;
    no baseline is a warning."""

    def add_options(self, p: ArgumentParser) -> None:
        for flag, default, metavar, text in (
            ("--baseline", "auto", "SPEC", "auto (the newest successful push, schedule or "
             "workflow_dispatch run of this workflow on the base branch; the action's input "
             "defaults to none), none, or a workflow run id"),
            ("--artifacts", "dlci-artifacts", "DIR", "this run's reports (default: "
             "dlci-artifacts)"),
            ("--host-record", os.environ.get("DLCI_HOST_RECORD"), "FILE", "the host's record of "
             "this run's reports: one it does not vouch for is left out (default: "
             "$DLCI_HOST_RECORD)"),
            ("--base-dir", None, "DIR", "the baseline's reports: no download"),
            ("--artifact-prefix", "dlci-artifacts", "NAME",
             "the baseline's artifact is NAME-<hardware class>-<job id>"),
            ("--max-utilization-drop", "", "PT", "fail when GPU utilization fell by more than PT "
             "percentage points, with 95%% confidence; empty: not gated"),
            ("--max-step-time-regression", "", "PCT", "fail when the step time grew by more than "
             "PCT percent, with 95%% confidence; empty: not gated"),
        ):  # fmt: skip
            p.add_argument(flag, default=default, metavar=metavar, help=text)
        p.add_argument("--comment", type=str.lower, choices=("true", "false"), default="false",
                       help="post or update the sticky comment on the pull request")  # fmt: skip
        p.add_argument("--block-likely", type=str.lower, choices=("true", "false"), default="false",
                       help="fail on a likely regression too (the estimate beyond the bound, the "
                       "change real; else a warning)")  # fmt: skip
        p.add_argument("--markdown", metavar="FILE", default=os.environ.get("GITHUB_STEP_SUMMARY")
                       or None, help="append the comparison to FILE (default: "
                       "$GITHUB_STEP_SUMMARY, else print it)")  # fmt: skip
        _common.add_json(p, "the comparison")

    def run(self, args: argparse.Namespace) -> int:
        if args.baseline == "none" and not args.base_dir:
            return 0
        if not (args.baseline == "auto" or args.baseline.isdigit() or args.base_dir):
            raise DlciError(f"--baseline: auto, none or a run id, got {args.baseline[:40]!r}")
        for flag, folder in (("--artifacts", args.artifacts), ("--base-dir", args.base_dir)):
            if folder is not None and not Path(folder).is_dir():
                raise DlciError(
                    f"{flag} {folder[:200]}: not a folder", hint="a folder of dl-ci reports"
                )
        token = os.environ.get("DLCI_GITHUB_TOKEN") or os.environ.get("GITHUB_TOKEN") or ""
        bounds = {"gpu_utilization_pct": _bound(args.max_utilization_drop),
                  "duration_us": _bound(args.max_step_time_regression)}  # fmt: skip
        # numpy: off `dlci baseline --help` and the action's default, a baseline of none
        from dlci.action.github.baseline import against_baseline
        from dlci.report.console import print_warning  # msgspec: as above
        from dlci.report.github import annotation, in_github_actions, write_outputs  # as above

        outcome = against_baseline(
            artifacts=Path(args.artifacts),
            host_record=Path(args.host_record) if args.host_record else None,
            spec=args.baseline,
            base_dir=Path(args.base_dir) if args.base_dir else None,
            prefix=args.artifact_prefix,
            token=token,
            max_utilization_drop=bounds["gpu_utilization_pct"],
            max_step_time=bounds["duration_us"],
            comment=args.comment == "true",
            block_likely=args.block_likely == "true",
        )
        if args.markdown:
            _common.append_to(args.markdown, outcome.markdown)
        elif args.json != "-":
            print(outcome.markdown)
        if args.json and outcome.result is not None:
            _common.emit_json(outcome.result, args.json)
        write_outputs(outcome.outputs)
        for note in outcome.notes:
            print(f"baseline: {clean(note)}", file=sys.stderr)
        for warning in outcome.warnings:
            print_warning(warning)
        for failure in outcome.failures:
            if in_github_actions():
                print(annotation("error", failure, title="dl-ci baseline"), flush=True)
            else:
                print(f"error: {clean(failure)}", file=sys.stderr)
        return 1 if outcome.failures else 0


main = BaselineVerb("baseline").main
