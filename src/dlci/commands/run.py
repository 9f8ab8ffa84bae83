"""``dlci run``: the whole job inside the container, one step after another.

The steps and their record (OUT/run.json) are dlci.action.job.run; this verb parses the options.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from dlci.action.host.verdicts import as_bool
from dlci.action.job import threads
from dlci.action.job.options import JobOptions
from dlci.action.job.run import run_job
from dlci.commands import _common
from dlci.commands._common import ArgumentParser
from dlci.commands.base import Verb


def _flag(p: argparse.ArgumentParser, name: str, help_on: str) -> None:
    p.add_argument(f"--{name}", dest=name.replace("-", "_"), action="store_true", default=True)
    p.add_argument(
        f"--no-{name}", dest=name.replace("-", "_"), action="store_false", help=f"skip {help_on}"
    )


def _boolean(value: str) -> bool:
    try:
        return as_bool(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


class RunVerb(Verb):
    """Run the job's steps in order (install, tests with doctests and coverage, the
    memorization test, the debugging checks, the profile and its analysis), writing every
    report to OUT and a step-by-step record to OUT/run.json. Exit 1 when a step fails; the
    later steps still run."""

    def add_options(self, p: ArgumentParser) -> None:
        _common.add_target(p)
        _common.add_tier_options(p, config=False)
        p.add_argument("--out", default="dlci-artifacts", metavar="DIR",
                       help="reports' folder (default: dlci-artifacts)")  # fmt: skip
        p.add_argument("--install", default="auto", metavar="CMD", help="how to install the "
                       "project: auto (pip install the requirements files and the project in "
                       "place), none, or a shell command (default: auto)")  # fmt: skip
        p.add_argument("--cpu-threads", default="auto", type=threads.argument, metavar="N",
                       help="torch's and OpenMP's threads per step (default auto: the CPU "
                       "quota)")  # fmt: skip
        p.add_argument(
            "--tests",
            default="",
            metavar="PATHS",
            help="test paths for pytest (default: pytest's own)",
        )
        p.add_argument("--pytest-args", default="", metavar="ARGS", help="more pytest arguments, "
                       "shell-quoted")  # fmt: skip
        _flag(p, "doctest", "doctests (of the project's own packages)")
        _flag(p, "coverage", "coverage")
        _flag(p, "memorize", "the memorization test")
        _flag(p, "doctor", "the debugging checks")
        _flag(p, "profile", "the profile and its analysis")
        for gate, what in (("min-gpu-util", "utilization"), ("max-gpu-memory", "GPU memory")):
            p.add_argument(f"--{gate}", type=float, metavar="PCT", help=f"the {what} gate "
                           f"(default: the configuration's {gate}; "
                           "docs/configuration.md)")  # fmt: skip
        p.add_argument(
            "--allow-no-tests",
            nargs="?",
            const="true",
            default="false",
            type=_boolean,
            metavar="BOOL",
            help="pass the tests step when pytest collects no tests (exit code 5); without it "
            "that is a failure (the action's input allow-no-tests passes true or false)",
        )
        p.add_argument(
            "--phase",
            default="all",
            choices=("all", "install", "tests", "memorize", "doctor", "profile"),
            help="run one part: install, tests (install, tests) or one gate (install, then the "
            "gate), as the action does, each in its own container (default: all)",
        )
        p.add_argument("--installed", action="store_true", help="skip the install step: the "
                       "image has the project installed (the action installs once a "
                       "job)")  # fmt: skip
        _common.add_detection(p)

    def run(self, args: argparse.Namespace) -> int:
        return run_job(
            JobOptions(
                out=Path(args.out), budget=args.budget, hardware=args.hardware,
                ladder=args.ladder, target=args.target, install=args.install, tests=args.tests,
                pytest_args=args.pytest_args, doctest=args.doctest, coverage=args.coverage,
                memorize=args.memorize, doctor=args.doctor, profile=args.profile,
                min_gpu_util=args.min_gpu_util, max_gpu_memory=args.max_gpu_memory,
                plan=args.plan, phase=args.phase, installed=args.installed,
                cpu_threads=args.cpu_threads, allow_no_tests=args.allow_no_tests,
            )
        )  # fmt: skip


main = RunVerb("run").main
