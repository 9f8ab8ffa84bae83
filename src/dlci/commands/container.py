"""``dlci container``: build or pull the job's image, run ``dlci run`` in it, clean up.

Host-side (the runner), never imports torch. Three subcommands, each over one function of
the action room: ``build`` (dlci.action.host.image.provide), ``run``
(dlci.action.host.container.run) and ``cleanup`` (dlci.action.host.cleanup.cleanup, which
writes OUT/cleanup.json).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path

from dlci.commands import _common
from dlci.errors import EXIT_USAGE, DlciError

USAGE = (
    "usage: dlci container {build,run,cleanup} ...\n\n"
    "Build or pull the job's image, run `dlci run` in it, clean up (host side).\n"
    "Run 'dlci container SUBCOMMAND --help' for its options."
)


def main(argv: Sequence[str]) -> int:
    if argv and argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0
    subcommands = {"build": _build, "run": _run, "cleanup": _cleanup}
    if not argv or argv[0] not in subcommands:
        what = f"unknown subcommand {argv[0]!r}" if argv else "a subcommand is required"
        print(USAGE.splitlines()[0], file=sys.stderr)  # as argparse does for every other verb
        hint = "run 'dlci container --help' for usage"
        raise DlciError(f"dlci container: {what}", hint=hint, exit_code=EXIT_USAGE)
    return subcommands[argv[0]](list(argv[1:]))


def _build(argv: list[str]) -> int:
    p = _common.parser(
        "container build",
        "Provide the job's image: use --image (pulled if missing), or build --dockerfile "
        "with a tag that is a hash of its inputs, skipped when that image already exists.",
    )
    p.add_argument("--image", default="", help="a prebuilt image to use instead of building")
    p.add_argument("--dockerfile", default="", metavar="FILE", help="the Dockerfile to build")
    p.add_argument("--context", default="", metavar="DIR", help="default: . for --dockerfile")
    kit = "dl-ci's own folder: without --dockerfile, build its docker/Dockerfile there"
    p.add_argument("--kit", default="", metavar="DIR", help=kit)
    p.add_argument("--base-image", default="", metavar="IMAGE", help="--build-arg BASE_IMAGE")
    p.add_argument("--build-arg", action="append", default=[], metavar="NAME=VALUE")
    p.add_argument("--extra-pip", default="", metavar="PKGS", help="--build-arg EXTRA_PIP")
    p.add_argument("--pip-index-url", default="", metavar="URL", help="--build-arg PIP_INDEX_URL")
    p.add_argument("--repository", default="dlci-local", help="the tag's repository name")
    p.add_argument("--timeout", type=float, default=3600.0, metavar="SECONDS")
    p.add_argument("--trust", choices=TRUST, default="auto", help="auto: GITHUB_EVENT_NAME's")
    p.add_argument("--network", default=os.environ.get("DLCI_NETWORK") or "auto", help=NET)
    args = p.parse_args(argv)

    from dlci.action.host.image import ImageRequest, provide
    from dlci.report.github import write_outputs

    image = provide(ImageRequest(**vars(args)))  # the options are the request's fields
    write_outputs({"image": image.tag, "built": "true" if image.built else "false"})
    print(image.tag)
    return 0


IPC, TRUST = ("private", "host"), ("auto", "trusted", "untrusted")
NET = "auto (default for trusted jobs, none for pull requests), default (Docker's bridge) or none"


def _run(argv: list[str]) -> int:
    p = _common.parser(
        "container run",
        "Run `dlci run ARGS...` in the image, with the workspace mounted. Everything after "
        "-- goes to dlci run.",
    )
    p.add_argument("--image", required=True)
    p.add_argument("--workspace", default=os.environ.get("GITHUB_WORKSPACE", "."), metavar="DIR")
    p.add_argument("--workdir", default=".", metavar="DIR", help="relative to the workspace")
    p.add_argument("--gpus", default="auto", help="auto (all if a GPU was found), all, none, N")
    p.add_argument("--shm-size", default="", help="shared memory size (default 2g)")
    p.add_argument("--ipc", choices=IPC, default=os.environ.get("DLCI_IPC") or "private")
    p.add_argument("--network", default=os.environ.get("DLCI_NETWORK") or "auto", help=NET)
    p.add_argument("--trust", choices=TRUST, default="auto", help="auto: GITHUB_EVENT_NAME's")
    p.add_argument("--cache-volume", default="dlci-cache", metavar="PREFIX", help="PREFIX-<trust>")
    p.add_argument("--env", action="append", default=[], metavar="NAME", help="one more variable")
    p.add_argument("--job", default=os.environ.get("DLCI_JOB_ID", ""), help="label for cleanup")
    p.add_argument("--timeout-minutes", type=float, default=60.0)
    p.add_argument("--memory", default="", help="e.g. 16g (no swap); empty: by trust")
    p.add_argument("--gpu-found", default="", help="true/false from preflight (for --gpus auto)")
    p.add_argument("inner", nargs="*", metavar="-- ARGS", help="arguments of dlci run")
    args = p.parse_args(argv)
    from dlci.action.host.container import RunRequest, run

    return 0 if run(RunRequest(**vars(args))) == 0 else 1


def _cleanup(argv: list[str]) -> int:
    p = _common.parser("container cleanup", "Remove the job's containers, restore ownership.")
    p.add_argument("--job", default=os.environ.get("DLCI_JOB_ID", ""))
    p.add_argument("--workspace", default=os.environ.get("GITHUB_WORKSPACE", "."), metavar="DIR")
    p.add_argument("--image", default="", help="unused (compatibility): no job image runs as root")
    p.add_argument("--out", default="dlci-artifacts", metavar="DIR")
    args = p.parse_args(argv)
    from dlci.action.host.cleanup import IMAGE_IGNORED, cleanup, describe
    from dlci.fsutil import refuse_link
    from dlci.report.console import print_warning

    if args.image:
        print(IMAGE_IGNORED, file=sys.stderr)
    report = cleanup(args.job, Path(args.workspace))
    refuse_link(args.out, "report")
    _common.emit_json(report, str(Path(args.out) / "cleanup.json"))
    line, warnings = describe(report)
    print(line, file=sys.stderr)
    list(map(print_warning, warnings))
    return 0
