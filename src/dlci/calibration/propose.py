"""From the seeds' loss curves to a proposed row per budget: threshold, epochs, time cap.

The rule, for each budget whose current row allows E_cur epochs to reach loss L_cur:

1. candidate thresholds are L_cur and the 1-2-5 values below it (1, 0.5, 0.2, 0.1, ...), down
   to the lowest loss the seeds reached; a candidate counts only when every seed reached it
   and no seed met it at the first step (a threshold the start already meets tests nothing);
2. each candidate's epochs E(L) are the tolerance bound of stats.bound: at most a fraction F
   of healthy runs need more, at the confidence C;
3. a candidate fits the budget when E(L) <= E_cur (the epochs the team gives this budget);
4. of those, the proposal is the one whose *detectable slowdown* E(L) / median T(L) is the
   smallest: a change that makes learning that many times slower fails the gate, so the
   smaller, the more the gate can see. Ties go to the deeper threshold.

When no candidate fits, the proposal keeps L_cur and says how many epochs it needs (more
than the budget gives: the current row fails healthy runs more often than F).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from dlci.calibration.stats import Bound, epochs_to, evaluate, tolerance_epochs
from dlci.ladder.format import TIME_CAP_MAX
from dlci.ladder.goal import Goal
from dlci.ladder.model import Tier, TierRow

TIME_MARGIN = 3.0  # the time cap: this many times the slowest measured step time, x E
TIME_FLOOR_MINUTES = 1.0  # a runner's load varies: below a minute the cap, not the model, decides
MAX_CANDIDATES = 24  # 1-2-5 values: eight decades below the current threshold


@dataclass(frozen=True)
class Candidate:
    threshold: float  # a max_relative_loss: the share of its start the loss must fall to
    reached: int  # seeds whose loss got below it (within the calibration's epochs)
    epochs: int | None  # E(L); None when a seed did not reach it, or met it at the first step
    median: float | None  # the median seed's epochs to it
    fits: bool  # every seed reached it, and E(L) <= the budget's epochs
    why: str  # why it does not count, or an empty string

    @property
    def slowdown(self) -> float | None:
        """E(L) / median T(L): how many times slower learning must get to fail the gate."""
        return None if self.epochs is None or not self.median else self.epochs / self.median


@dataclass(frozen=True)
class Proposal:
    budget: str
    tier: Tier  # the current row, as the ladder gives it for this class
    current: Bound  # the current row's failure rates, from the same seeds
    row: TierRow | None  # the proposed row; None when the seeds cannot support any
    bound: Bound | None
    candidates: tuple[Candidate, ...]
    over_allowance: bool = False  # the proposal needs more epochs than the current row
    notes: tuple[str, ...] = field(default=())
    tried: int = 1  # the grid's thresholds (Bonferroni's m)
    each: float = 0.95  # the confidence of each one's bound: 1 - (1 - C) / m

    @property
    def slowdown(self) -> float | None:
        return None if self.bound is None else self.bound.epochs / self.bound.median


def thresholds(current: float, lowest: float) -> list[float]:
    """``current``, then the 1-2-5 values below it down to ``lowest`` (largest first).

    >>> thresholds(1.0, 0.04)
    [1.0, 0.5, 0.2, 0.1, 0.05]
    >>> thresholds(0.3, 0.1)
    [0.3, 0.2, 0.1]
    """
    floor = max(lowest, current * 10.0 ** -(MAX_CANDIDATES // 3), 1e-30)
    values = [current]
    exponent = math.floor(math.log10(current)) + 1
    while len(values) < MAX_CANDIDATES + 1:
        for mantissa in (5, 2, 1):
            value = float(f"{mantissa}e{exponent}")
            if floor <= value < current:
                values.append(value)
        exponent -= 1
        if float(f"5e{exponent}") < floor:
            break
    return values[: MAX_CANDIDATES + 1]


def candidate(
    times: Sequence[int | None], threshold: float, allowed: int, rate: float, conf: float
) -> Candidate:
    """What the seeds' epochs to ``threshold`` say for a budget that allows ``allowed`` epochs."""
    reached = [t for t in times if t is not None]
    if len(reached) < len(times):
        why = f"{len(times) - len(reached)} of {len(times)} seeds never reached it"
        return Candidate(threshold, len(reached), None, None, False, why)
    if min(reached) <= 1:
        why = "the first step already meets it: it tests nothing"
        return Candidate(threshold, len(reached), None, None, False, why)
    epochs = tolerance_epochs(reached, rate, conf)
    fits = epochs <= allowed
    why = "" if fits else f"needs {epochs} epochs, the budget gives {allowed}"
    return Candidate(threshold, len(reached), epochs, statistics.median(reached), fits, why)


def propose_budget(
    curves: Sequence[Sequence[float]],
    tier: Tier,
    *,
    rate: float,
    confidence: float,
    step_s: float,
) -> Proposal:
    """The proposed row of one budget (see the module docstring for the rule)."""
    lowest = min((v for curve in curves for v in curve if math.isfinite(v)), default=0.0)
    values = thresholds(current_share(tier), lowest)
    times = [[epochs_to(curve, value) for curve in curves] for value in values]
    # every threshold of the grid gets its own bound: at confidence 1 - (1 - C) / m each, m the
    # whole grid's size (fixed before the runs: not how many the seeds happened to reach), they
    # all hold at once with confidence C (Bonferroni), so choosing among them keeps C
    tried = len(thresholds(current_share(tier), 0.0))
    each = 1 - (1 - confidence) / tried
    options = [
        candidate(t, value, tier.max_epochs, rate, each)
        for t, value in zip(times, values, strict=True)
    ]
    current = evaluate(times[0], tier.max_epochs, each)
    best, note = choose(options, tier)
    notes = (note,) if note else ()
    if best is None or best.epochs is None:
        return Proposal(
            tier.budget, tier, current, None, None, tuple(options), False, notes, tried, each
        )
    found = evaluate(times[values.index(best.threshold)], best.epochs, each)
    row = TierRow(
        max_epochs=found.epochs,
        max_loss=None,
        max_relative_loss=best.threshold,
        time_cap_minutes=time_cap(found.epochs, step_s),
        profile_steps=tier.profile_steps,
        nproc=tier.nproc,
        batch_size=tier.batch_size,
    )
    over = found.epochs > tier.max_epochs
    return Proposal(
        tier.budget, tier, current, row, found, tuple(options), over, notes, tried, each
    )


def choose(options: Sequence[Candidate], tier: Tier) -> tuple[Candidate | None, str]:
    """The candidate with the smallest slowdown among those that fit (ties: the lower loss);
    when none fits, the current threshold if the seeds reached it; and a note why."""
    fitting = [c for c in options if c.fits]
    if fitting:
        return min(fitting, key=lambda c: (round(c.slowdown or math.inf, 9), c.threshold)), ""
    current = options[0]  # the current threshold: the epochs must grow, or nothing fits
    if current.epochs is None:
        return None, (
            f"no proposal: at the current threshold {current_share(tier):g} of the start, "
            f"{current.why}; "
            "give the calibration more epochs (--epochs) or a looser threshold"
        )
    return current, (
        f"no threshold fits the {tier.max_epochs} epochs of the current row at the stated "
        f"rate: the current threshold needs {current.epochs}"
    )


def current_share(tier: Tier) -> float:
    """The tier's relative threshold: its own, or the built-in one for an absolute-only row.

    Calibration judges every curve as shares of its start (an absolute threshold means
    nothing across tasks); a row that states only ``max_loss`` is compared at the share
    every pass needs anyway (ladder/goal.py).
    """
    return Goal(tier.max_loss, tier.max_relative_loss).relative_limit


def time_cap(epochs: int, step_s: float) -> float:
    """Minutes for ``epochs`` steps of ``step_s`` seconds, with the margin and the floor.

    >>> time_cap(100, 0.003), time_cap(1000, 0.5), time_cap(1000, 2.0)
    (1.0, 25.0, 100.0)
    """
    minutes = TIME_MARGIN * epochs * step_s / 60
    if minutes <= TIME_FLOOR_MINUTES:
        return TIME_FLOOR_MINUTES
    nice = math.ceil(minutes * 10) / 10 if minutes < 10 else float(math.ceil(minutes))
    return min(nice, float(TIME_CAP_MAX))


def step_time(walls: Sequence[float], steps: Sequence[int]) -> float:
    """The slowest seed's mean seconds per step (parallel workers share the machine, so this
    errs long)."""
    per_step = [w / s for w, s in zip(walls, steps, strict=True) if s > 0]
    return max(per_step) if per_step else 0.0


def median_or_nan(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")
