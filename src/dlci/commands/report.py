"""``dlci report``: one self-contained HTML report of a folder of dl-ci's reports."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from dlci.commands._common import ArgumentParser
from dlci.commands.base import Verb
from dlci.errors import DlciError
from dlci.report import html
from dlci.report.text import clean


class ReportVerb(Verb):
    """Write report.html for a folder that dlci doctor, memorize or profile wrote into (their
    --out), or a job's downloaded dlci-artifacts: the verdicts, the memorization curve, the
    doctor's checks and figures, utilization and memory, the comparison with the base branch
    and the history, with every image inside the file (it opens offline). dlci doctor,
    memorize and profile write one themselves; this renders one again, or one for a folder
    they wrote into in turn. No torch needed."""

    def add_options(self, p: ArgumentParser) -> None:
        p.add_argument(
            "folder",
            metavar="FOLDER",
            nargs="?",
            default="dlci-artifacts",
            help="the folder of reports (default: dlci-artifacts, where the verbs write)",
        )
        p.add_argument(
            "--output", metavar="FILE", help="where to write the HTML (default: FOLDER/report.html)"
        )

    def run(self, args: argparse.Namespace) -> int:
        folder = Path(args.folder)
        if not folder.is_dir():
            raise DlciError(
                f"{args.folder}: not a folder (looked in {clean(folder.resolve())})",
                hint="name the --out folder of dlci doctor, memorize or profile, or run one of "
                "them here first",
            )
        path = html.write_report(folder, args.output)
        print(f"report: wrote {clean(path)}", file=sys.stderr)
        return 0


main = ReportVerb("report").main
