"""``dlci container``: build or pull the job's image, run ``dlci run`` in it, clean up.

Host-side, never imports torch. Four subcommands, each a Verb over one function of dlci.action.host:
``build`` (image.provide), ``run`` (container.run), ``bisect`` (bisect.bisect), ``cleanup``.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from dlci.action.host import cleanup, container, image
from dlci.commands import _common
from dlci.commands._common import ArgumentParser
from dlci.commands.base import Verb
from dlci.commands.container_bisect import Bisect
from dlci.errors import EXIT_USAGE, DlciError
from dlci.fsutil import refuse_link
from dlci.report.console import print_warning
from dlci.report.github import write_outputs

USAGE = (
    "usage: dlci container {build,run,bisect,cleanup} ...\n\n"
    "Build or pull the job's image, run `dlci run` in it, bisect a red run, clean up.\n"
    "Run 'dlci container SUBCOMMAND --help' for its options."
)
IPC, TRUST = ("private", "host"), ("auto", "trusted", "untrusted")
NET = "auto (default for trusted jobs, none for pull requests), default (Docker's bridge) or none"


def main(argv: Sequence[str]) -> int:
    if argv and argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0
    subcommands = {"build": Build, "run": Run, "bisect": Bisect, "cleanup": Cleanup}
    if not argv or argv[0] not in subcommands:
        what = f"unknown subcommand {argv[0]!r}" if argv else "a subcommand is required"
        print(USAGE.splitlines()[0], file=sys.stderr)  # as argparse does for every other verb
        hint = "run 'dlci container --help' for usage"
        raise DlciError(f"dlci container: {what}", hint=hint, exit_code=EXIT_USAGE)
    return subcommands[argv[0]](f"container {argv[0]}").main(argv[1:])


class Build(Verb):
    """Provide the job's image: use --image (pulled if missing), or build --dockerfile with a
    tag that is a hash of its inputs, skipped when that image already exists."""

    def add_options(self, p: ArgumentParser) -> None:
        add = p.add_argument
        add("--image", default="", help="a prebuilt image to use instead of building")
        add("--dockerfile", default="", metavar="FILE", help="the Dockerfile to build")
        add("--context", default="", metavar="DIR", help="default: . for --dockerfile")
        add("--kit", default="", metavar="DIR", help="dl-ci's own folder: without --dockerfile, "
            "build its docker/Dockerfile there")  # fmt: skip
        add("--base-image", default="", metavar="IMAGE", help="--build-arg BASE_IMAGE")
        add("--build-arg", action="append", default=[], metavar="NAME=VALUE")
        add("--extra-pip", default="", metavar="PKGS", help="--build-arg EXTRA_PIP")
        add("--pip-index-url", default="", metavar="URL", help="--build-arg PIP_INDEX_URL")
        add("--repository", default="dlci-local", help="the tag's repository name")
        add("--timeout", type=float, default=3600.0, metavar="SECONDS")
        add("--trust", choices=TRUST, default="auto", help="auto: GITHUB_EVENT_NAME's")
        add("--network", default=os.environ.get("DLCI_NETWORK") or "auto", help=NET)

    def run(self, args: argparse.Namespace) -> int:
        # the options are the request's fields
        built = image.provide(image.ImageRequest(**vars(args)))
        write_outputs({"image": built.tag, "built": "true" if built.built else "false"})
        print(built.tag)
        return 0


class Run(Verb):
    """Run `dlci run ARGS...` in the image, with the workspace mounted. Everything after --
    goes to dlci run."""

    def add_options(self, p: ArgumentParser) -> None:
        add = p.add_argument
        add("--image", required=True)
        add("--workspace", default=os.environ.get("GITHUB_WORKSPACE", "."), metavar="DIR")
        add("--workdir", default=".", metavar="DIR", help="relative to the workspace")
        add("--gpus", default="auto", help="auto (all if a GPU was found), all, none, N")
        add("--shm-size", default="", help="shared memory size (default 2g)")
        add("--ipc", choices=IPC, default=os.environ.get("DLCI_IPC") or "private")
        add("--network", default=os.environ.get("DLCI_NETWORK") or "auto", help=NET)
        add("--trust", choices=TRUST, default="auto", help="auto: GITHUB_EVENT_NAME's")
        add("--cache-volume", default="dlci-cache", metavar="PREFIX", help="PREFIX-<trust>")
        add("--env", action="append", default=[], metavar="NAME", help="one more variable")
        add("--job", default=os.environ.get("DLCI_JOB_ID", ""), help="label for cleanup")
        add("--timeout-minutes", type=float, default=60.0)
        add("--memory", default="", help="e.g. 16g (no swap); empty: by trust")
        add("--gpu-found", default="", help="true/false from preflight (for --gpus auto)")
        add("inner", nargs="*", metavar="-- ARGS", help="arguments of dlci run")

    def run(self, args: argparse.Namespace) -> int:
        return 0 if container.run(container.RunRequest(**vars(args))) == 0 else 1


class Cleanup(Verb):
    """Remove the job's containers, restore ownership."""

    def add_options(self, p: ArgumentParser) -> None:
        add = p.add_argument
        add("--job", default=os.environ.get("DLCI_JOB_ID", ""))
        add("--workspace", default=os.environ.get("GITHUB_WORKSPACE", "."), metavar="DIR")
        add("--image", default="", help="unused (compatibility): no job image runs as root")
        add("--out", default="dlci-artifacts", metavar="DIR")

    def run(self, args: argparse.Namespace) -> int:
        if args.image:
            print(cleanup.IMAGE_IGNORED, file=sys.stderr)
        report = cleanup.cleanup(args.job, Path(args.workspace))
        refuse_link(args.out, "report")
        _common.emit_json(report, str(Path(args.out) / "cleanup.json"))
        line, warnings = cleanup.describe(report)
        print(line, file=sys.stderr)
        list(map(print_warning, warnings))
        return 0
