"""``dlci preflight``: the runner host's checks before a job (no torch is imported)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from dlci import jsonio
from dlci.commands import _common
from dlci.commands._common import ArgumentParser
from dlci.commands.base import Verb
from dlci.errors import DlciError
from dlci.report.console import print_warning
from dlci.report.github import write_outputs


class PreflightVerb(Verb):
    """Check the runner host before a job: refuse a fork's pull request on a self-hosted runner
    (unless allowed), detect the GPU without torch, select the tier, and check the Docker engine
    and, with a GPU, the NVIDIA container runtime. Writes OUT/preflight.json, pass or fail, so the
    job summary can say what happened."""

    def add_options(self, p: ArgumentParser) -> None:
        _common.add_tier_options(p, config=False, plan=False)
        p.add_argument(
            "--allow-fork-prs",
            action="store_true",
            default=os.environ.get("DLCI_ALLOW_FORK_PRS", "").lower() in ("1", "true", "yes"),
            help="run pull requests from forks on a self-hosted runner too "
            "(default: $DLCI_ALLOW_FORK_PRS, else refuse; see docs/security.md)",
        )
        p.add_argument(
            "--max-time-cap-minutes",
            type=float,
            default=float(os.environ.get("DLCI_MAX_TIME_CAP_MINUTES") or 0) or None,
            metavar="MINUTES",
            help="a ceiling on the tier's time cap, whatever the ladder says "
            "(default: $DLCI_MAX_TIME_CAP_MINUTES; on a pull request whose ladder cannot be "
            "checked against the base branch: the default ladder's nightly cap for the class)",
        )
        p.add_argument(
            "--working-directory",
            default=os.environ.get("DLCI_WORKDIR") or ".",
            metavar="DIR",
            help="the project's directory, where its configuration is read (default: "
            "$DLCI_WORKDIR, else .; on a pull request its trusted keys come from the base commit)",
        )
        p.add_argument(
            "--no-docker",
            dest="docker",
            action="store_false",
            help="skip the Docker checks (for a job that runs on the host)",
        )
        p.add_argument(
            "--out",
            default="dlci-artifacts",
            metavar="DIR",
            help="directory for preflight.json (default: dlci-artifacts)",
        )
        _common.add_json(p, "the preflight report")
        _common.add_detection(p, probes="nvml,nvidia-smi")  # the host side: never torch

    def run(self, args: argparse.Namespace) -> int:
        if "torch" in [x.strip() for x in args.probes.split(",")]:
            raise DlciError(
                "dlci preflight never imports torch: leave torch out of --probes",
                hint="use --probes nvml,nvidia-smi",
            )
        detection = _common.detection_options(args)
        # off `dlci preflight --help`: the ladder and the configuration (yaml) load to run
        from dlci.action.host.preflight import PreflightRequest, preflight

        report = preflight(
            PreflightRequest(
                out=Path(args.out),
                budget=args.budget,
                hardware=args.hardware,
                ladder=args.ladder,
                allow_fork_prs=args.allow_fork_prs,
                max_time_cap_minutes=args.max_time_cap_minutes,
                docker=args.docker,
                timeout=detection["timeout"],
                probes=detection["probes"],
                copies=(args.json,) if args.json else (),
                workdir=Path(args.working_directory),
            )
        )
        for warning in report["warnings"]:
            print_warning(warning)
        tier = report["tier"]
        write_outputs(
            {
                "hardware-class": tier["hardware_class"],
                "budget": tier["budget"],
                "gpu": "true" if report["gpu"] else "false",
                "tier-json": jsonio.encode(tier, indent=False).decode(),
            }
        )
        if args.json != "-":
            print(_line(report))
        return 0


def _line(report: dict[str, Any]) -> str:
    """The one line a person reads: the tier, the path, Docker, a fork let through."""
    tier = report["tier"]
    return (
        f"preflight: {tier['budget']} tier on {tier['hardware_class']}"
        + (" (GPU)" if report["gpu"] else " (CPU path)")
        + (f"; Docker {report['docker']['server_version']}" if "docker" in report else "")
        + ("; fork pull request allowed" if report["fork_guard"]["fork"] else "")
    )


main = PreflightVerb("preflight").main
