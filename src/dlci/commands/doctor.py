"""``dlci doctor``: the ordered debugging checks on a target."""

from __future__ import annotations

import argparse
import sys
from typing import Any, TextIO

from rich.console import Console
from rich.progress import BarColumn, TextColumn, TimeElapsedColumn
from rich.progress import Progress as Bar

from dlci.checks import select
from dlci.checks.base import CheckResult
from dlci.checks.doctor import DoctorRequest, run_doctor
from dlci.commands import _common
from dlci.commands._common import ArgumentParser
from dlci.commands.base import ScriptVerb
from dlci.config import resolve
from dlci.policy import CHECK_IDS
from dlci.report import doctor as report
from dlci.report.text import clean
from dlci.script.run import doctor_script


class DoctorVerb(ScriptVerb):
    """Run the debugging ladder on the target: cheap checks first, each ruling out a class of
    silent deep-learning bug. Exit 1 when any check fails. After --: your script."""

    def add_options(self, p: ArgumentParser) -> None:
        _common.add_target(p)
        _common.add_tier_options(p)
        _common.add_json(p, "the report (default: OUT/doctor.json)")
        add = p.add_argument
        add("--markdown", metavar="FILE", help="also write the report as Markdown")
        add("--out", default="dlci-artifacts", metavar="DIR", help="directory for "
            "doctor.json, figures/ and report.html (default: dlci-artifacts)")  # fmt: skip
        add("--only", metavar="IDS", help="comma-separated check IDs to run, in ladder "
            "order: " + ", ".join(CHECK_IDS))  # fmt: skip
        add("--stop-on-fail", action="store_true", help="skip the rest after a failure")
        add("--seed", type=int, default=0, help="seed for every generator (default: 0)")
        add("--device", default=None, help="cpu, cuda or cuda:N (default: the GPU if any)")
        _common.add_detection(p)

    def run(self, args: argparse.Namespace) -> int:
        # the waivers and thresholds: [tool.dlci] or dlci.toml; under the action the plan's
        config = resolve(cli={"target": args.target, "ladder": args.ladder}, plan=args.plan)
        request = DoctorRequest(
            target=args.target, tier=_common.tier_request(args), only=args.only,
            stop_on_fail=args.stop_on_fail, seed=args.seed, device=args.device, out=args.out,
            json=args.json, markdown=args.markdown, policy=config.policy,
        )  # fmt: skip
        with _common.stdout_for_the_report(args.json), Progress(len(select(args.only))) as p:
            outcome = doctor_script(request, args.script) if args.script else run_doctor(request, p)
        if outcome.json_path == "-":
            _common.emit_json(outcome.report, "-")
        else:
            report.print_table(outcome.report)
            print(f"report {clean(outcome.json_path)}")
            if outcome.html is not None:
                print(f"html   {clean(outcome.html)}")
        return outcome.exit_code


class Progress:
    """Each check as it ends, on standard error. On a terminal: one transient line (checks
    done, the last one's status), erased before the table, which has every check; a run that
    stops with an error (no table follows) leaves the checks' lines. Elsewhere (a CI log, a
    pipe): a line a check, which stays, the trace of how far a killed run got."""

    def __init__(self, total: int, stream: TextIO | None = None) -> None:
        self.total, self.stream = total, stream or sys.stderr
        self.lines: list[str] = []
        self._bar: Any = None
        self._task: Any = None

    def __enter__(self) -> Progress:
        if self.stream.isatty():
            self._bar = Bar(
                TextColumn("doctor", markup=False),
                BarColumn(),
                TextColumn("{task.completed}/{task.total} checks", markup=False),
                TextColumn("{task.fields[last]}", markup=False),
                TimeElapsedColumn(),
                console=Console(file=self.stream, markup=False, highlight=False),
                transient=True,
            )
            self._bar.__enter__()
            self._task = self._bar.add_task("doctor", total=self.total, last="")
        return self

    def __call__(self, result: CheckResult) -> None:
        lines = [f"doctor: {result.id:<20} {result.status}"]
        if result.cause.startswith("the target exited before a verdict"):
            lines.append(f"doctor: {clean(result.cause)}")
        self.lines += lines
        if self._bar is not None:
            self._bar.update(self._task, advance=1, last=f"{result.id} {result.status}")
            return
        for line in lines:
            print(line, file=self.stream, flush=True)

    def __exit__(self, kind: type[BaseException] | None, *rest: object) -> None:
        if self._bar is None:
            return
        self._bar.__exit__(kind, *rest)
        if kind is not None:  # no table follows: what ran stays on the screen
            for line in self.lines:
                print(line, file=self.stream, flush=True)


main = DoctorVerb("doctor").main
