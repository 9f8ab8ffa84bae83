"""``dlci calibrate``: measure the ladder's numbers on this model and this hardware class."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from dlci.calibration.run import CalibrationRequest, run_calibration
from dlci.calibration.summary import CalibrationReport
from dlci.commands import _common
from dlci.commands._common import ArgumentParser
from dlci.commands.base import Verb
from dlci.report.text import clean


class CalibrateVerb(Verb):
    """Run the memorization test on many seeds, propose each budget's max_relative_loss, max_epochs
    and time cap so that a healthy run fails at most --false-failure-rate of the time, and show what
    the proposal still catches (sabotaged variants of the same target)."""

    def add_options(self, p: ArgumentParser) -> None:
        _common.add_target(p)
        add = p.add_argument
        add("--budget", default="all", help="a budget of the ladder, or all (default: all)")
        add("--hardware", default="auto", help="auto, or the class this machine is (default: auto)")
        _common.add_ladder(p)
        add("--seeds", type=int, default=16, help="healthy runs, one per seed (default: 16)")
        add("--first-seed", type=int, default=0, help="the first seed (default: 0)")
        add(
            "--false-failure-rate",
            type=float,
            default=0.01,
            metavar="F",
            help="the most healthy runs a row may fail, above 0 and below 0.5 (default: 0.01)",
        )
        add("--confidence", type=float, default=0.95, help="of every bound (default: 0.95)")
        add("--epochs", type=int, help="of each run (default: twice the largest max_epochs)")
        add("--workers", type=int, help="processes (default: one per GPU, else per CPU core)")
        add(
            "--power-seeds", type=int, default=2, help="per sabotaged variant; 0: none (default: 2)"
        )
        add("--device", default=None, help="cpu, cuda or cuda:N (default: the GPUs if any)")
        add(
            "--out",
            default="dlci-calibration",
            metavar="DIR",
            help="for the runs and the reports; a calibration into it again keeps the finished "
            "runs (default: dlci-calibration)",
        )
        _common.add_json(p, "calibration.json")
        p.add_argument("--quiet", action="store_true", help="no progress output")
        _common.add_detection(p)

    def run(self, args: argparse.Namespace) -> int:
        request = CalibrationRequest(
            target=args.target,
            budget=args.budget,
            hardware=args.hardware,
            ladder=args.ladder,
            detection=_common.detection_options(args),
            seeds=args.seeds,
            first_seed=args.first_seed,
            rate=args.false_failure_rate,
            confidence=args.confidence,
            epochs=args.epochs,
            workers=args.workers,
            power_seeds=args.power_seeds,
            device=args.device,
            out=args.out,
        )
        with _common.stdout_for_the_report(args.json):
            outcome = run_calibration(request, (lambda line: None) if args.quiet else _say)
        if args.json:
            _common.emit_json(outcome.report, args.json)
        stream = sys.stderr if args.json == "-" else sys.stdout
        missing = _print(outcome.report, stream)
        files = ", ".join(str(path) for path in outcome.files.values())
        print(f"  files: {clean(files)}", file=stream)
        return 1 if missing else 0


def _say(line: str) -> None:
    print(f"calibrate: {clean(line)}", file=sys.stderr, flush=True)


def _print(report: CalibrationReport, stream: Any) -> int:
    """One line per budget: the proposal next to the current row; how many lack one."""
    missing = 0
    for budget, entry in report.budgets.items():
        now, row = entry.current, entry.proposal
        head = f"{budget}/{report.hardware_class}"
        if row is None:
            missing += 1
            print(
                f"calibrate {clean(head)}: no proposal; {clean('; '.join(entry.notes))}",
                file=stream,
            )
            continue
        print(
            f"calibrate {clean(head)}: max_relative_loss {row.max_relative_loss:g}, max_epochs "
            f"{row.max_epochs}, time cap {row.time_cap_minutes:g} min (current "
            f"{now.max_relative_loss:g}, {now.max_epochs}, {now.time_cap_minutes:g}); "
            "healthy "
            f"failures {_rate(row.estimated_rate)}, bound {_rate(row.upper_bound)} at "
            f"{report.confidence:.0%}; catches a {row.detectable_slowdown or 0.0:.2f}x slowdown",
            file=stream,
        )
    return missing


def _rate(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2%}"


main = CalibrateVerb("calibrate").main
