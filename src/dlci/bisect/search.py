"""The decisions of a noise-aware bisection, with no I/O: which commit to run next, what its
runs say, and when the answer stands.

Commits are numbered 0 (the good one, taken as good) to n (the bad one). Each verdict comes
from one or more runs of the gate (``pass``, ``fail`` or ``skip``: a commit that cannot be
installed or run). A commit's verdict is the majority of its judged runs (skips aside). The
search keeps ``hi``, the lowest commit counted bad, and ``lo``, the highest commit below it
counted good, and runs the untested commit nearest the middle of the commits between them
that are not skipped, as ``git bisect`` does. Noise is met twice:

- a verdict near its threshold (``near``) is re-run at once, on other seeds, before it counts;
- when only skipped commits (or none) lie between ``lo`` and ``hi``, the verdicts the answer
  rests on are confirmed: the first bad commit's fail (and, for a gate whose passes can be
  luck, the last good commit's pass) is re-run unless it already was. A confirmation that
  overturns the verdict (a healthy commit that failed on an unlucky seed) moves the
  boundary, and the search goes on.

The bad commit itself is run only when the answer would be it: a red night that was itself
noise then passes and the search says so (``not-reproduced``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

PASS, FAIL, SKIP = "pass", "fail", "skip"


@dataclass
class Tally:
    """One commit's runs: each a list of per-seed verdicts."""

    runs: list[list[str]] = field(default_factory=list)

    @property
    def judged(self) -> list[str]:
        return [v for run in self.runs for v in run if v != SKIP]

    @property
    def verdict(self) -> str | None:
        """The majority of the judged runs (a tie counts as fail); skip if none was judged.

        >>> Tally([["fail"], ["pass", "pass"]]).verdict, Tally([["skip"]]).verdict
        ('pass', 'skip')
        """
        if not self.runs:
            return None
        judged = self.judged
        if not judged:
            return SKIP
        return PASS if judged.count(PASS) > judged.count(FAIL) else FAIL

    @property
    def settled(self) -> bool:
        """Re-run at least once (or skipped): no further confirmation."""
        return len(self.runs) > 1 or self.verdict == SKIP


@dataclass(frozen=True)
class Step:
    index: int
    purpose: str  # "test": its first run; "recheck": near its threshold; "confirm": the boundary


@dataclass(frozen=True)
class Answer:
    status: str  # found, range, not-reproduced, unfinished
    lo: int  # the last commit counted good
    hi: int  # the first commit counted bad (n when not reproduced)
    candidates: tuple[int, ...]  # the commits the first bad one may be

    @property
    def first_bad(self) -> int | None:
        return self.hi if self.status == "found" else None


class Search:
    """The bisection's state over commits 0..n; ``reruns`` 0 turns noise handling off."""

    def __init__(self, n: int, *, reruns: int = 2, confirm_passes: bool = False) -> None:
        if n < 1:
            raise ValueError("a bisection needs a good and a bad commit")
        self.n = n
        self.reruns = reruns
        self.confirm_passes = confirm_passes
        self.tallies: dict[int, Tally] = {}

    def verdict(self, index: int) -> str | None:
        if index == 0:
            return PASS
        tally = self.tallies.get(index)
        if tally is None or tally.verdict is None:
            return FAIL if index == self.n else None
        return tally.verdict

    def record(self, index: int, verdicts: Sequence[str]) -> None:
        self.tallies.setdefault(index, Tally()).runs.append(list(verdicts))

    def bounds(self) -> tuple[int, int]:
        hi = min(i for i in range(1, self.n + 1) if self.verdict(i) == FAIL)
        lo = max(i for i in range(hi) if self.verdict(i) == PASS)
        return lo, hi

    def next(self, near: int | None = None) -> Step | Answer:
        """The next run, or the answer. ``near``: the commit just run was near its
        threshold (its first run), so it is re-run at once."""
        if near is not None and self.reruns and not self.tallies[near].settled:
            return Step(near, "recheck")
        if self.verdict(self.n) == PASS:  # the bad commit passed: confirmed, the night was noise
            if self.reruns and not self.tallies[self.n].settled:
                return Step(self.n, "confirm")
            return Answer("not-reproduced", self.n, self.n, ())
        lo, hi = self.bounds()
        between = range(lo + 1, hi)
        untested = [i for i in between if self.verdict(i) is None]
        if untested:
            middle = (lo + hi) / 2
            return Step(min(untested, key=lambda i: (abs(i - middle), i)), "test")
        if hi == self.n and self.n not in self.tallies:
            return Step(self.n, "test")  # the answer would be the bad commit: run it
        for index, asked in ((hi, True), (lo, self.confirm_passes)):
            tally = self.tallies.get(index)
            if asked and self.reruns and tally is not None and not tally.settled:
                return Step(index, "confirm")
        candidates = tuple(range(lo + 1, hi + 1))
        return Answer("found" if len(candidates) == 1 else "range", lo, hi, candidates)

    def unfinished(self) -> Answer:
        """The answer so far, when the budget ran out."""
        if self.verdict(self.n) == PASS:
            return Answer("unfinished", self.n, self.n, ())
        lo, hi = self.bounds()
        return Answer("unfinished", lo, hi, tuple(range(lo + 1, hi + 1)))
