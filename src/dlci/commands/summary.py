"""``dlci summary``: the job summary, step outputs and annotations, from dlci-artifacts/.

Host-side (no torch). What the job left is read by dlci.action.host.summary and rendered by
dlci.report.summary; a job that failed early still gets a summary of what ran. Exit 1 when
the job failed, so the summary step can carry the verdict.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from dlci.commands import _common
from dlci.commands._common import ArgumentParser
from dlci.commands.base import Verb
from dlci.report.text import clean


class SummaryVerb(Verb):
    """Write the job summary (GITHUB_STEP_SUMMARY), the step outputs (GITHUB_OUTPUT) and
    ::error annotations from the reports in the artifacts directory. Exit 1 when the job
    failed."""

    def add_options(self, p: ArgumentParser) -> None:
        p.add_argument("--artifacts", default="dlci-artifacts", metavar="DIR")
        p.add_argument(
            "--markdown",
            metavar="FILE",
            default=os.environ.get("GITHUB_STEP_SUMMARY") or None,
            help="append the summary to FILE (default: $GITHUB_STEP_SUMMARY, else print it)",
        )
        p.add_argument("--no-fail", action="store_true", help="exit 0 whatever the verdict")
        p.add_argument("--title", default="dl-ci", help="the summary's heading")
        p.add_argument(
            "--artifact-prefix",
            default="",
            metavar="NAME",
            help="also output artifact-name: NAME-<hardware class>-<job id>, unique per matrix leg",
        )
        p.add_argument(
            "--host-record",
            metavar="FILE",
            default=os.environ.get("DLCI_HOST_RECORD") or None,
            help="the host's record of the container run (default: $DLCI_HOST_RECORD): take "
            "the tier and run.json from it and check every gate report against it",
        )

    def run(self, args: argparse.Namespace) -> int:
        # off `dlci summary --help`: the reports' readers (msgspec) load when the verb runs
        from dlci.action.host.summary import summarize
        from dlci.report.github import annotation, in_github_actions, write_outputs  # as above

        summary = summarize(
            Path(args.artifacts),
            title=args.title,
            artifact_prefix=args.artifact_prefix,
            host_record=Path(args.host_record) if args.host_record else None,
        )
        if args.markdown:
            _common.append_to(args.markdown, summary.markdown, what=" the summary")
        else:
            print(summary.markdown)
        write_outputs(summary.outputs)
        for level, message, title in summary.annotations:
            if in_github_actions():
                print(annotation(level, message, title=title), flush=True)
            else:
                print(f"{level}: {clean(title)}: {clean(message)}", file=sys.stderr)
        return 1 if summary.verdict == "fail" and not args.no_fail else 0


main = SummaryVerb("summary").main
