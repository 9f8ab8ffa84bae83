"""What ``dlci memorize`` is asked and answers: the request, the outcome, and the variables
that carry a run into torchrun's workers (read by run.py, launch.py, seeds.py and single.py)."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from dlci import jsonio
from dlci.errors import DlciError
from dlci.ladder.tiers import TierRequest
from dlci.report.fields import Memorization

DISTRIBUTED_FLAG = "DLCI_MEMORIZE_WORKER"  # set in torchrun's workers, so they do not relaunch
# The workers' arguments travel in the environment: torchrun's own parser would otherwise
# take options such as --nproc as abbreviations of its own.
ARGV_VARIABLE = "DLCI_MEMORIZE_ARGV"
VERDICT_VARIABLE = "DLCI_MEMORIZE_VERDICT"  # where rank 0 writes pass or fail for the launcher
WATCHDOG_VARIABLE = "DLCI_WATCHDOG"  # "off": no watchdog inside a step (for dl-ci's own tests)
NO_VERDICT = (
    "the run ended before a verdict: the process stopped inside the target's code "
    "(os._exit, a signal, or out of memory) before dl-ci could judge it"
)

Say = Callable[[str], None]  # one line for the user, on standard error


@dataclass(frozen=True)
class MemorizeRequest:
    """What ``dlci memorize`` was asked for, its options as parsed."""

    target: str | None = None
    tier: TierRequest = field(default_factory=TierRequest)
    out: str = "dlci-artifacts"
    json: str | None = None  # None: OUT/memorization.json; "-": standard output
    seed: int = 0
    device: str | None = None
    nproc: int | None = None  # None: the tier's
    early_stop: bool = True
    tracker: str = "tensorboard"
    quiet: bool = False
    argv: tuple[str, ...] = ()  # the command line, run again in each DDP process
    seeds: int = 1  # seeds run in turn (seed, seed + 1, ...): memorization/seeds.py
    quorum: int | None = None  # seeds that must pass; None: all


@dataclass
class MemorizeOutcome:
    """The exit code, and on the process that reports (rank 0) the report and where it went."""

    exit_code: int
    report: Memorization | None = None
    json_path: str = ""  # "-": the caller prints the report on standard output
    curve: Path | None = None


def is_worker() -> bool:
    """Whether this process is one of the DDP processes a launcher started."""
    return os.environ.get(DISTRIBUTED_FLAG) == "1"


def worker_argv(argv: Sequence[str]) -> list[str]:
    """The command line; in a DDP process started without one, the launcher's."""
    if is_worker() and not argv:
        return [str(arg) for arg in jsonio.decode(os.environ.get(ARGV_VARIABLE) or "[]")]
    return list(argv)


def check_out(out: str) -> None:
    """--out is a directory, or a path where one can be made: not a file, nor under one.

    Checked before anything runs, so the mistake is one message, not a crash at the end.
    """
    path = Path(out)
    for place in (path, *path.parents):
        if place.is_dir():
            return
        if os.path.lexists(place):
            what = "is a file" if place.is_file() else "is not a directory"
            where = "" if place == path else f" (its parent {place} {what})"
            raise DlciError(
                f"--out {out}: " + (what if place == path else "cannot be made") + where,
                hint="give --out a directory for the reports; it is made if it does not exist",
            )
