"""``dlci bisect``: the first commit between a good and a bad one that fails a gate.

Each candidate is checked out in a clean worktree of its own (never the caller's working
tree), made importable, and judged by one ``dlci`` gate run in a subprocess; noisy verdicts
are re-run on other seeds before they count (docs/nightly.md). Runs code from many commits:
for a trusted branch's scheduled or push runs, never a pull request's job.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from dlci.bisect.gates import Gate
from dlci.bisect.render import console_lines, markdown
from dlci.bisect.run import BisectRequest, run_bisect
from dlci.commands import _common
from dlci.commands._common import ArgumentParser
from dlci.commands.base import Verb
from dlci.report.text import clean

# flag, keyword arguments of add_argument: the bisect's own options
OPTIONS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("--good", {"required": True, "metavar": "REV", "help": "a commit that passed the gate, "
                "or last-green: the newest night of --history whose memorization passed"}),
    ("--bad", {"default": "HEAD", "metavar": "REV", "help": "a commit that fails (HEAD)"}),
    ("--history", {"metavar": "FILE", "help": "history.json of dlci history, for last-green"}),
    ("--repo", {"default": ".", "metavar": "DIR", "help": "the repository (default: .)"}),
    ("--gate", {"default": "memorize", "choices": ("memorize", "profile", "doctor")}),
    ("--min-gpu-util", {"type": float, "metavar": "PCT", "help": "profile: the bound"}),
    ("--max-step-time-ms", {"type": float, "metavar": "MS", "help": "profile: the bound"}),
    ("--check", {"metavar": "ID", "help": "doctor: the one check that must not fail"}),
    ("--device", {"help": "cpu, cuda or cuda:N, for every gate run"}),
    ("--install", {"default": "path", "choices": ("path", "pip"), "help": "path: the "
                   "commit's source on PYTHONPATH (default); pip: pip install --no-deps into "
                   "a folder of its own"}),
    ("--seed", {"type": int, "default": 0, "help": "the first run's seed (default: 0)"}),
    ("--reruns", {"type": int, "default": 2, "metavar": "K", "help": "seeds a near or "
                  "decisive verdict is re-run on (default: 2; 0: no re-runs)"}),
    ("--near", {"type": float, "default": 0.25, "metavar": "SHARE", "help": "how near its "
                "threshold a verdict is re-run at once (default: 0.25)"}),
    ("--errors-fail", {"action": "store_true", "help": "a run with no verdict (the target "
                       "cannot be imported or built) fails instead of being skipped"}),
    ("--max-runs", {"type": int, "metavar": "N", "help": "gate runs at most (default: the "
                    "bisection's need plus 4)"}),
    ("--time-cap", {"type": float, "default": 60.0, "metavar": "MIN",
                    "help": "minutes for the whole bisect (default: 60)"}),
    ("--run-timeout", {"type": float, "default": 30.0, "metavar": "MIN",
                       "help": "minutes for one gate run (default: 30)"}),
    ("--markdown", {"metavar": "FILE", "help": "append the answer as Markdown to FILE"}),
    ("--github-token", {"metavar": "TOKEN", "help": "look up "
                        "each suspect's pull request and author (default: $GITHUB_TOKEN; "
                        "GITHUB_API_URL and GITHUB_REPOSITORY say where)"}),
    ("--keep", {"action": "store_true", "help": "keep the worktrees and run folders"}),
)  # fmt: skip


class BisectVerb(Verb):
    """Find the first commit between --good and --bad that fails the gate, with every tested
    commit's verdict and figures. The cost bound is printed before it starts. Exit 0 with an answer
    (one commit, or a range where commits could not be run), 1 when the budget ran out first."""

    def add_options(self, p: ArgumentParser) -> None:
        for flag, keywords in OPTIONS:
            p.add_argument(flag, **keywords)
        _common.add_target(p)
        _common.add_tier_options(p)
        _common.add_json(p, "the answer as JSON")

    def run(self, args: argparse.Namespace) -> int:
        gate = Gate(args.gate, _passthrough(args), args.min_gpu_util, args.max_step_time_ms,
                    args.check, args.near, args.errors_fail)  # fmt: skip
        request = BisectRequest(
            repo=Path(args.repo), good=args.good, bad=args.bad, gate=gate,
            install=args.install, reruns=args.reruns, seed=args.seed, max_runs=args.max_runs,
            time_cap_minutes=args.time_cap, run_timeout_minutes=args.run_timeout, keep=args.keep,
            github_token=args.github_token or os.environ.get("GITHUB_TOKEN") or None,
            history=args.history,
        )  # fmt: skip
        data = run_bisect(
            request, say=lambda line: print(f"bisect: {clean(line)}", file=sys.stderr)
        )
        if args.json:
            _common.emit_json(data, args.json)
        if args.markdown:
            with open(args.markdown, "a", encoding="utf-8") as handle:
                handle.write(markdown(data))
        stream = sys.stderr if args.json == "-" else sys.stdout
        print("\n".join(console_lines(data)), file=stream)
        return 1 if data.status == "unfinished" else 0


def _passthrough(args: argparse.Namespace) -> tuple[str, ...]:
    """The options every gate run gets as they were given."""
    out: list[str] = []
    for flag in ("--target", "--budget", "--hardware", "--ladder", "--plan", "--device"):
        value = getattr(args, flag[2:].replace("-", "_"))
        if flag in ("--ladder", "--plan") and value and Path(value).is_file():
            value = str(Path(value).resolve())  # the caller's file judges every commit
        if value is not None and not (flag in ("--budget", "--hardware") and value == "auto"):
            out += [flag, str(value)]
    return tuple(out)


main = BisectVerb("bisect").main
