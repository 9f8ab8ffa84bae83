"""``dlci container bisect``: after a red run of the trusted branch, name the commit that broke
it (dlci.action.host.bisect; the action's ``bisect`` input). Host-side, never imports torch.
"""

from __future__ import annotations

import argparse
import os

from dlci.action.host.bisect import NightRequest, bisect
from dlci.commands._common import ArgumentParser
from dlci.commands.base import Verb
from dlci.report.github import write_outputs


class Bisect(Verb):
    """On a push, schedule or manual run whose gate failed: run `dlci bisect` from the last
    green run's commit to this one in one container of the job's image, look up the culprit's
    pull request, keep bisect.json beside the host's reports (the summary shows it first).
    Never on a pull request's run. Exit 1 when the bisect ran out of runs or time."""

    def add_options(self, p: ArgumentParser) -> None:
        add = p.add_argument
        add("--image", required=True)
        add("--host-record", dest="record", default=os.environ.get("DLCI_HOST_RECORD", ""),
            metavar="FILE", help="the host's record of the job's run (default: "
            "$DLCI_HOST_RECORD)")  # fmt: skip
        add(
            "--good",
            default="last-green",
            metavar="REV",
            help="a commit that passed, or "
            "last-green: the newest successful run of this workflow on this branch (default)",
        )
        add("--time-cap-minutes", dest="time_cap_minutes", type=float, default=60.0)
        add("--comment", choices=("true", "false"), default="false",
            help="comment the answer on the culprit's pull request")  # fmt: skip
        add("--workspace", default=os.environ.get("GITHUB_WORKSPACE", "."), metavar="DIR")
        add("--workdir", default=".", metavar="DIR", help="the project, in the repository")
        add("--target", default="", help="module:function (default: each commit's own)")
        add("--gpus", default="auto")
        add("--gpu-found", dest="gpu_found", default="")
        add("--shm-size", dest="shm_size", default="")
        add("--memory", default="")
        add("--network", default=os.environ.get("DLCI_NETWORK") or "auto")
        add("--job", default=os.environ.get("DLCI_JOB_ID", ""), help="label for cleanup")

    def run(self, args: argparse.Namespace) -> int:
        token = os.environ.get("DLCI_GITHUB_TOKEN") or os.environ.get("GITHUB_TOKEN") or ""
        options = {**vars(args), "comment": args.comment == "true", "token": token}
        outcome = bisect(NightRequest(**options))
        write_outputs(outcome.outputs())
        return outcome.exit_code
