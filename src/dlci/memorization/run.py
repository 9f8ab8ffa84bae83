"""A whole memorization run, as ``dlci memorize`` makes it: choose the tier, relaunch under
torchrun for DDP (launch.py), then one seed (single.py) or several (seeds.py)."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from dlci.errors import DlciError
from dlci.ladder.model import Tier
from dlci.memorization.engine import Distributed
from dlci.memorization.launch import init_process_group, launch
from dlci.memorization.request import (
    NO_VERDICT,
    VERDICT_VARIABLE,
    MemorizeOutcome,
    MemorizeRequest,
    Say,
    check_out,
    is_worker,
)
from dlci.memorization.seeds import check_seeds, run_seeds
from dlci.memorization.single import RunReport, train_one, write_run_outputs
from dlci.memorization.tracking import NullTracker, make_tracker
from dlci.training.target import resolve_spec


def run_memorize(request: MemorizeRequest, say: Say) -> MemorizeOutcome:
    """Run the memorization test as ``request`` asks; a failed test is an outcome, not an error."""
    check_out(request.out)
    spec = resolve_spec(request.target)
    tier = request.tier.choose()
    nproc = request.nproc if request.nproc is not None else tier.nproc
    if nproc < 1:
        raise DlciError(f"--nproc must be at least 1, got {nproc}", hint="use --nproc 2")
    if request.seeds != 1 or request.quorum is not None:
        check_seeds(request.seeds, request.quorum, nproc)
    if nproc > 1 and not is_worker():
        return MemorizeOutcome(launch(request.argv, nproc, say, quiet=request.quiet))
    return _run(request, spec, tier, say)


def _run(request: MemorizeRequest, spec: str, tier: Tier, say: Say) -> MemorizeOutcome:
    dist = Distributed.from_env()
    if dist.active:
        init_process_group(dist)
    report = RunReport(request, spec, tier) if dist.rank == 0 else None
    try:
        if report is not None:  # a failing report first: it stays if the process dies
            report.write_partial("exited", NO_VERDICT)
        return _memorize(request, spec, tier, dist, say, report)
    except DlciError as exc:
        if report is None:
            return MemorizeOutcome(1)  # rank 0 reports the same mistake; one message is enough
        with contextlib.suppress(OSError, DlciError):  # the error itself is what counts
            where = f"{exc.location}: " if exc.location else ""
            report.write_partial("error", where + exc.message)
        raise
    finally:
        if dist.active:
            import torch.distributed

            torch.distributed.destroy_process_group()


def _memorize(
    request: MemorizeRequest,
    spec: str,
    tier: Tier,
    dist: Distributed,
    say: Say,
    report: RunReport | None,
) -> MemorizeOutcome:
    if request.seeds > 1:
        return run_seeds(request, spec, tier, say, report)
    leader = report is not None
    out = Path(request.out)
    tracker = make_tracker(request.tracker, out, "memorize") if leader else NullTracker()
    outcome = MemorizeOutcome(0)
    try:
        result = train_one(request, spec, tier, dist, say, report, tracker)
        if leader:
            outcome = write_run_outputs(request, spec, tier, result, tracker)
    finally:
        tracker.close()
    if dist.active:
        if leader:
            Path(os.environ[VERDICT_VARIABLE]).write_text(result.verdict)
        outcome.exit_code = 0  # the launcher turns the verdict into the exit code
    else:
        outcome.exit_code = 0 if result.passed else 1
    return outcome
