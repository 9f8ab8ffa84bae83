"""``dlci memorize``: overfit one batch of the target to the tier's loss threshold."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from dlci.commands import _common
from dlci.commands._common import ArgumentParser
from dlci.commands.base import Verb
from dlci.memorization.request import MemorizeOutcome, MemorizeRequest, worker_argv
from dlci.memorization.run import run_memorize
from dlci.report.html import report_folder
from dlci.report.text import clean
from dlci.script.command import split_command
from dlci.script.run import memorize_script


class MemorizeVerb(Verb):
    """Overfit one small batch of the target until the loss falls below the tier's threshold;
    stop as soon as it does, fail when the tier's epoch or time cap runs out. After --: the
    user's own script, unchanged (docs/script-mode.md)."""

    def parse(self, argv: Sequence[str]) -> argparse.Namespace:
        argv, script = split_command(worker_argv(argv))  # torchrun: the launcher's command line
        return argparse.Namespace(**vars(super().parse(argv)), script=script, argv=tuple(argv))

    def add_options(self, p: ArgumentParser) -> None:
        _common.add_target(p)
        _common.add_tier_options(p)
        _common.add_json(p, "the report (default: OUT/memorization.json)")
        p.add_argument(
            "--out", default="dlci-artifacts", metavar="DIR",
            help="directory for the report, the loss curve and tracking (default: dlci-artifacts)",
        )  # fmt: skip
        _add_run_options(p)
        p.add_argument(
            "--no-early-stop",
            dest="early_stop",
            action="store_false",
            help="run every epoch of the tier even after the threshold is reached",
        )
        p.add_argument(
            "--tracker",
            default=os.environ.get("DLCI_TRACKER") or "tensorboard",
            choices=("tensorboard", "wandb", "none"),
            help="where the run's configuration and metrics go (default: tensorboard)",
        )
        p.add_argument("--quiet", action="store_true", help="no progress output")
        _common.add_detection(p)

    def run(self, args: argparse.Namespace) -> int:
        request = MemorizeRequest(
            target=args.target, tier=_common.tier_request(args), out=args.out, json=args.json,
            seed=args.seed, seeds=args.seeds, quorum=args.quorum, device=args.device,
            nproc=args.nproc, early_stop=args.early_stop, tracker=args.tracker,
            quiet=args.quiet, argv=args.argv,
        )  # fmt: skip
        with _common.stdout_for_the_report(args.json):
            if args.script:
                outcome = memorize_script(request, args.script, say=_say)
            else:
                outcome = run_memorize(request, say=_say)
        if outcome.report is not None and report_folder(outcome.json_path, args.out):
            _common.write_html(args.out, (lambda _: None) if args.quiet else _say)
        _print_verdict(outcome)
        return outcome.exit_code


def _add_run_options(p: ArgumentParser) -> None:
    """--seed, --seeds, --quorum, --device, --nproc."""
    p.add_argument("--seed", type=int, default=0, help="seed for every generator (default: 0)")
    p.add_argument(
        "--seeds",
        type=int,
        default=1,
        help="run seeds --seed, --seed + 1, ... in turn; pass when --quorum of them pass "
        "(default: 1)",
    )
    p.add_argument("--quorum", type=int, default=None, help="seeds that must pass (default: all)")
    p.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: the GPU if any)")
    p.add_argument(
        "--nproc",
        type=int,
        default=None,
        help="processes under torchrun with DDP (default: the tier's nproc)",
    )


def _say(line: str) -> None:
    print(f"memorize: {clean(line)}", file=sys.stderr, flush=True)


def _print_verdict(outcome: MemorizeOutcome) -> None:
    """The verdict and where the outputs went; on stderr when the report is on stdout."""
    report = outcome.report
    if report is None:  # a DDP launcher, or a rank other than 0: rank 0 reports
        return
    if outcome.json_path == "-":
        _common.emit_json(report, "-")
    stream = sys.stderr if outcome.json_path == "-" else sys.stdout
    mark = "PASS" if report.verdict == "pass" else "FAIL"
    print(f"memorization {mark}: {clean(report.reason)}", file=stream)
    if mark == "FAIL" and report.next_step:
        print(f"  next: {clean(report.next_step)}", file=stream)
    where = (
        "report on standard output" if outcome.json_path == "-" else f"report {outcome.json_path}"
    )
    where += f", curve {outcome.curve}" if outcome.curve else ""
    print(f"  {clean(where)}, tracking {clean(report.tracking)}", file=stream)


main = MemorizeVerb("memorize").main
