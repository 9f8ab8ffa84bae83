"""``dlci preflight``: the runner host's checks before a job (no torch is imported)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from dlci import jsonio
from dlci.commands import _common
from dlci.commands._common import ArgumentParser
from dlci.commands.base import Verb
from dlci.errors import DlciError
from dlci.report.console import print_warning
from dlci.report.github import write_outputs
from dlci.report.text import clean


class PreflightVerb(Verb):
    """Check the runner host before a job: refuse a fork's pull request on a self-hosted runner
    (unless allowed), detect the GPU without torch, select the tier, and check the Docker engine
    and, with a GPU, the NVIDIA container runtime. Writes OUT/preflight.json, pass or fail, so the
    job summary can say what happened."""

    def add_options(self, p: ArgumentParser) -> None:
        _common.add_tier_options(p, config=False, plan=False)
        p.add_argument("--allow-fork-prs", action="store_true", default=os.environ.get(
                       "DLCI_ALLOW_FORK_PRS", "").lower() in ("1", "true", "yes"), help="run pull "
                       "requests from forks on a self-hosted runner too (default: "
                       "$DLCI_ALLOW_FORK_PRS, else refuse; see docs/security.md)")  # fmt: skip
        p.add_argument("--max-time-cap-minutes", type=float, metavar="MINUTES",
                       default=float(os.environ.get("DLCI_MAX_TIME_CAP_MINUTES") or 0) or None,
                       help="a ceiling on the tier's time cap, whatever the ladder says "
                       "(default: $DLCI_MAX_TIME_CAP_MINUTES; on a pull request whose ladder "
                       "cannot be checked against the base branch: the default ladder's nightly "
                       "cap for the class)")  # fmt: skip
        for flag, default, metavar, text in (
            ("--working-directory", os.environ.get("DLCI_WORKDIR") or ".", "DIR", "the "
             "project's directory, where its configuration is read (default: $DLCI_WORKDIR, "
             "else .; on a pull request its trusted keys come from the base commit)"),
            ("--baseline", os.environ.get("DLCI_BASELINE") or "none", "SPEC", "with a bound "
             "set, size the tier's profile_steps from this baseline's steps, best effort "
             "(docs/comparison.md): auto, a workflow run id, or none (default: $DLCI_BASELINE, "
             "else none); the token: $DLCI_GITHUB_TOKEN, else $GITHUB_TOKEN"),
            ("--base-dir", None, "DIR", "where the baseline is kept (dlci baseline --base-dir)"),
            ("--artifact-prefix", os.environ.get("DLCI_ARTIFACT_PREFIX") or "dlci-artifacts",
             "NAME", "the baseline's artifact is NAME-<hardware class>-<job id> (default: "
             "$DLCI_ARTIFACT_PREFIX, else dlci-artifacts)"),
            ("--out", "dlci-artifacts", "DIR", "directory for preflight.json (default: "
             "dlci-artifacts)"),
        ):  # fmt: skip
            p.add_argument(flag, default=default, metavar=metavar, help=text)
        p.add_argument("--no-docker", dest="docker", action="store_false",
                       help="skip the Docker checks (for a job that runs on the host)")  # fmt: skip
        _common.add_json(p, "the preflight report")
        _common.add_detection(p, probes="nvml,nvidia-smi")  # the host side: never torch

    def run(self, args: argparse.Namespace) -> int:
        if "torch" in [x.strip() for x in args.probes.split(",")]:
            raise DlciError(
                "dlci preflight never imports torch: leave torch out of --probes",
                hint="use --probes nvml,nvidia-smi",
            )
        detection = _common.detection_options(args)
        # the token: in this process alone, never in the environment of git, docker, nvidia-smi
        token = os.environ.pop("DLCI_GITHUB_TOKEN", "") or os.environ.get("GITHUB_TOKEN", "")
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
                baseline=args.baseline,
                base_dir=Path(args.base_dir) if args.base_dir else None,
                artifact_prefix=args.artifact_prefix,
                token=token,
            )
        )
        if "profile_sizing" in report:
            print(f"baseline: profile: {clean(report['profile_sizing'].reason)}", file=sys.stderr)
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
