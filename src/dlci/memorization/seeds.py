"""``dlci memorize --seeds K [--quorum Q]``: the gate on K seeds, passing when Q of them pass.

One seed can pass by luck: code that memorizes only from a lucky initialisation is
seed-sensitive, and the nightly tier runs several seeds to see it. The seeds run in turn
(``--seed``, ``--seed + 1``, ...), each a whole memorization run under the tier; the report is
the first failing seed's (or the first seed's when all pass), its verdict and reason those of
the quorum, and its ``seeds`` section lists every run.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from dlci.errors import DlciError
from dlci.ladder.model import Tier
from dlci.memorization.engine import Distributed
from dlci.memorization.request import MemorizeOutcome, MemorizeRequest, Say
from dlci.memorization.single import train_one, write_run_outputs
from dlci.memorization.tracking import NullTracker, make_tracker
from dlci.memorization.verdict import MemorizeResult
from dlci.report.fields import SeedRun, SeedRuns

MAX_SEEDS = 1000


def check_seeds(seeds: int, quorum: int | None, nproc: int) -> None:
    """--seeds and --quorum in bounds, and no seeds under DDP (one seed per launch there)."""
    if not 1 <= seeds <= MAX_SEEDS:
        raise DlciError(f"--seeds must be from 1 to {MAX_SEEDS}, got {seeds}", hint="use --seeds 4")
    if quorum is not None and not 1 <= quorum <= seeds:
        raise DlciError(
            f"--quorum must be from 1 to --seeds ({seeds}), got {quorum}",
            hint=f"use --quorum {seeds} (every seed must pass), or leave it out",
        )
    if seeds > 1 and nproc > 1:
        raise DlciError(
            f"--seeds {seeds} with {nproc} processes (DDP) is not supported",
            hint="run several seeds with --nproc 1, or one seed under DDP",
        )


def combine(runs: list[tuple[int, MemorizeResult]], quorum: int) -> tuple[int, MemorizeResult]:
    """The seed whose run the report shows, and that run with the quorum's verdict.

    >>> from dlci.memorization.verdict import partial
    >>> ok = replace(partial(stopped_by="threshold", reason="loss 0.9 < 1", losses=[0.9]),
    ...              verdict="pass")
    >>> bad = partial(stopped_by="epochs", reason="the loss did not reach 1", losses=[2.0])
    >>> seed, result = combine([(0, ok), (1, bad), (2, ok)], quorum=2)
    >>> seed, result.verdict, result.reason
    (1, 'pass', '2 of 3 seeds passed (quorum 2); seed 1 failed: the loss did not reach 1')
    """
    passed = sum(result.passed for _, result in runs)
    failed = [(seed, result) for seed, result in runs if not result.passed]
    seed, shown = failed[0] if failed else runs[0]
    verdict = "pass" if passed >= quorum else "fail"
    head = f"{passed} of {len(runs)} seeds passed (quorum {quorum})"
    detail = f"seed {seed} failed: {shown.reason}" if failed else f"seed {seed}: {shown.reason}"
    return seed, replace(shown, verdict=verdict, reason=f"{head}; {detail}")


def run_seeds(
    request: MemorizeRequest, spec: str, tier: Tier, say: Say, report: Any
) -> MemorizeOutcome:
    """Run ``request.seeds`` seeds in turn and write one report (see the module docstring)."""
    quorum = request.seeds if request.quorum is None else request.quorum
    runs: list[tuple[int, MemorizeResult]] = []
    for seed in range(request.seed, request.seed + request.seeds):
        one = replace(request, seed=seed)
        if report is not None:
            report.request = one  # a stuck run's partial report names its own seed
        tracker = make_tracker(request.tracker, Path(request.out), f"memorize-seed-{seed}")
        try:
            result = train_one(one, spec, tier, Distributed(), say, report, tracker)
        finally:
            tracker.close()
        runs.append((seed, result))
        say(f"seed {seed}: {'PASS' if result.passed else 'FAIL'}: {result.reason}")
    seed, combined = combine(runs, quorum)
    section = SeedRuns(
        count=len(runs),
        quorum=quorum,
        passed=sum(result.passed for _, result in runs),
        runs=[
            SeedRun(
                seed=s,
                verdict=r.verdict,
                stopped_by=r.stopped_by,
                steps=r.steps,
                best_loss=r.to_dict()["best_loss"],
                reason=r.reason,
            )
            for s, r in runs
        ],
    )
    shown = replace(request, seed=seed)
    outcome = write_run_outputs(shown, spec, tier, combined, NullTracker(), seeds=section)
    outcome.exit_code = 0 if combined.passed else 1
    return outcome
