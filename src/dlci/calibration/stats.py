"""The false-failure statistics of a proposed tier: how often a healthy run would fail it.

A healthy run fails a tier (``max_epochs`` E, ``max_loss`` L) when its loss is not below L
within E epochs, that is when its *epochs to threshold* T(L) exceed E. Calibration measures
T(L) on N seeds and bounds P(T > E) two ways:

- **parametric** (what the proposal is built on): log T is taken as normal across seeds.
  E is the one-sided upper *tolerance bound* ``exp(mean + k * sd)`` of the logs, with the
  factor k from the non-central t distribution, so that with confidence C at least a
  fraction 1 - F of healthy runs reach L within E epochs (Natrella, *Experimental
  Statistics*, NBS Handbook 91, 1963, ch. 2-5; ISO 16269-6). Its estimate is the fitted
  normal's tail at E; its bound inverts the same tolerance relation at E.
- **distribution-free** (what holds whatever the shape): the count k of seeds that failed
  E and the Clopper-Pearson upper bound on the failure probability at confidence C. With E
  at least the slowest seed's epochs (k = 0) this is the order-statistics bound
  ``1 - (1 - C) ** (1 / N)``, valid for any distribution: 16 seeds bound the rate by 17%
  at 95%, and ``seeds_needed`` says how many seeds would bound it by F.

Pure Python (math only): the non-central t integral is a Simpson sum over the chi law.
"""

from __future__ import annotations

import functools
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from dlci.ladder.goal import Goal, smoothed

_NORMAL = statistics.NormalDist()
_SIMPSON_POINTS = 256  # even; the chi law is smooth over its +-8 span: the error is below 1e-8


def normal_cdf(x: float) -> float:
    return _NORMAL.cdf(x)


def normal_quantile(p: float) -> float:
    return _NORMAL.inv_cdf(p)


def _chi_log_pdf(w: float, nu: int) -> float:
    """The log density of the chi law with ``nu`` degrees of freedom at ``w`` > 0."""
    return (nu - 1) * math.log(w) - w * w / 2 - (nu / 2 - 1) * math.log(2) - math.lgamma(nu / 2)


@functools.lru_cache(maxsize=64)
def _chi_grid(nu: int, points: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Simpson's nodes over the chi law's +-8 span, and their weights times the density."""
    centre = math.sqrt(max(nu - 0.5, 0.5))
    low, high = max(0.0, centre - 8.0), centre + 8.0
    step = (high - low) / points
    nodes, weights = [], []
    for i in range(points + 1):
        w = low + i * step
        if w > 0.0:
            density = math.exp(_chi_log_pdf(w, nu))
        else:  # the chi law's density at 0: sqrt(2 / pi) for one degree of freedom, else 0
            density = math.sqrt(2 / math.pi) if nu == 1 else 0.0
        simpson = 1 if i in (0, points) else (4 if i % 2 else 2)
        nodes.append(w)
        weights.append(simpson * density * step / 3)
    return tuple(nodes), tuple(weights)


def noncentral_t_cdf(t: float, nu: int, delta: float) -> float:
    """P(T <= t) for T = (Z + delta) / sqrt(V / nu), Z normal and V chi-square with nu d.f.

    >>> round(noncentral_t_cdf(0.0, 5, 0.0), 6)  # the central t is symmetric
    0.5
    """
    # T <= t  <=>  Z <= t * W / sqrt(nu) - delta, with W = sqrt(V) on the chi law
    slope = t / math.sqrt(nu)  # the normal CDF's argument moves this fast in w
    span = 16.0 + min(math.sqrt(max(nu - 0.5, 0.5)) - 8.0, 0.0)
    points = 2 * math.ceil(max(_SIMPSON_POINTS, span * abs(slope) * 8) / 2)
    nodes, weights = _chi_grid(nu, points)
    root2 = math.sqrt(2.0)
    total = math.fsum(
        weight * 0.5 * math.erfc((delta - slope * w) / root2)
        for w, weight in zip(nodes, weights, strict=True)
    )
    return min(1.0, max(0.0, total))


def _bisect(f: Callable[[float], float], low: float, high: float, iterations: int) -> float:
    """The root of an increasing function ``f`` between ``low`` and ``high``."""
    for _ in range(iterations):
        middle = (low + high) / 2
        if f(middle) < 0:
            low = middle
        else:
            high = middle
    return (low + high) / 2


@functools.lru_cache(maxsize=256)
def tolerance_factor(n: int, rate: float, confidence: float) -> float:
    """k such that ``mean + k * sd`` of n normal values exceeds a fraction ``1 - rate`` of the
    population with probability ``confidence`` (one-sided normal tolerance bound).

    >>> round(tolerance_factor(10, 0.01, 0.95), 3), round(tolerance_factor(20, 0.1, 0.95), 3)
    (3.981, 1.926)
    """
    if n < 2:
        raise ValueError("a tolerance bound needs at least 2 values")
    nu, delta = n - 1, normal_quantile(1 - rate) * math.sqrt(n)
    high = delta + 10.0
    while noncentral_t_cdf(high, nu, delta) < confidence:
        high *= 2
    t = _bisect(lambda x: noncentral_t_cdf(x, nu, delta) - confidence, 0.0, high, 50)
    return t / math.sqrt(n)


def tolerance_rate(n: int, k: float, confidence: float) -> float:
    """The failure rate whose tolerance factor is ``k``: the inverse of tolerance_factor in
    ``rate``, so the upper bound at confidence ``confidence`` for a limit k sds above the mean.

    >>> round(tolerance_rate(10, 3.981, 0.95), 4)
    0.01
    """
    nu, t = n - 1, k * math.sqrt(n)
    # the CDF falls as delta grows; find delta where it equals the confidence
    delta = _bisect(lambda d: confidence - noncentral_t_cdf(t, nu, d), -60.0, 60.0, 50)
    return min(1.0, max(0.0, 1 - normal_cdf(delta / math.sqrt(n))))


def binomial_cdf(k: int, n: int, p: float) -> float:
    """P(X <= k) for X binomial(n, p), summed in logs (n up to thousands)."""
    if p <= 0.0:
        return 1.0
    if p >= 1.0:
        return 1.0 if k >= n else 0.0
    total = 0.0
    for i in range(k + 1):
        log_term = (
            math.lgamma(n + 1)
            - math.lgamma(i + 1)
            - math.lgamma(n - i + 1)
            + i * math.log(p)
            + (n - i) * math.log1p(-p)
        )
        total += math.exp(log_term)
    return min(1.0, total)


def clopper_pearson_upper(failures: int, n: int, confidence: float) -> float:
    """The one-sided Clopper-Pearson upper bound on a probability seen ``failures`` times in n.

    >>> round(clopper_pearson_upper(0, 16, 0.95), 4)  # = 1 - 0.05 ** (1 / 16)
    0.1707
    >>> round(clopper_pearson_upper(2, 20, 0.95), 4)
    0.2826
    """
    if failures >= n:
        return 1.0
    return _bisect(lambda p: (1 - confidence) - binomial_cdf(failures, n, p), 0.0, 1.0, 80)


def seeds_needed(rate: float, confidence: float) -> int:
    """Seeds, all passing, for the distribution-free bound to reach ``rate``.

    >>> seeds_needed(0.01, 0.95), seeds_needed(0.05, 0.95)
    (299, 59)
    """
    return math.ceil(math.log(1 - confidence) / math.log1p(-rate))


def relative_curve(
    losses: Sequence[float], floor: float | None, blind: float | None = None
) -> list[float]:
    """``losses``, each judged as the gate judges it (the median of its last steps,
    ladder/goal.smoothed), as shares of the reference (the first loss, the start, or the
    input-blind baseline ``blind`` below it) above ``floor``: what a tier judges.

    A loss that cannot be judged against its start (below 0 with no declared floor, or a
    start at the floor) is NaN, where a gate stops (ladder/goal.py).

    >>> relative_curve([2.0, 1.0, 0.1], None)  # the third: the median of 1.0 and 0.1
    [1.0, 0.5, 0.275]
    >>> relative_curve([2.0, 1.0, 0.1], 0.0, blind=1.0)  # the blind baseline below the start
    [2.0, 1.0, 0.55]
    >>> relative_curve([0.5, -0.1], None)
    [1.0, nan]
    >>> relative_curve([1.0, -0.5], -1.0)
    [1.0, 0.25]
    """
    if not losses:
        return []
    goal, start = Goal(None, None, floor, blind), losses[0]
    judged = [losses[0]] + [smoothed(list(losses[: i + 1])) for i in range(1, len(losses))]
    values = [goal.relative(start, v) for v in judged]
    return [
        v if v is not None else (x if not math.isfinite(x) else math.nan)
        for v, x in zip(values, losses, strict=True)
    ]


def epochs_to(losses: Sequence[float], threshold: float) -> int | None:
    """The first epoch (1-based) whose loss is below ``threshold``; None if none is.

    >>> epochs_to([2.0, 1.2, 0.9, 0.5], 1.0), epochs_to([2.0, float("nan")], 1.0)
    (3, None)
    """
    for index, value in enumerate(losses):
        if not math.isfinite(value):
            return None  # the run stopped here: a gate fails at once
        if value < threshold:
            return index + 1
    return None


@dataclass(frozen=True)
class Bound:
    """What the seeds say about one threshold: the proposed epochs and their failure rates."""

    epochs: int  # E: the tolerance bound, at least the slowest seed's epochs
    median: float  # the median seed's epochs to threshold
    slowest: int
    mean_log: float
    sd_log: float  # with its floor (see fit)
    estimated_rate: float  # the fitted normal's tail at E
    upper_rate: float  # its bound at the confidence (log-normal model)
    failures: int  # seeds with T > E (0 by construction, kept for the record)
    free_upper_rate: float  # Clopper-Pearson on failures of N: no model


def fit(times: Sequence[int]) -> tuple[float, float]:
    """Mean and sd of log T; the sd is at least half an epoch at the median (epochs are whole
    numbers, so a smaller spread cannot be seen, and N equal counts do not mean no spread).

    >>> fit([10, 10, 10])[1] == 0.5 / 10
    True
    """
    logs = [math.log(t) for t in times]
    mean = statistics.fmean(logs)
    sd = statistics.stdev(logs) if len(logs) > 1 else 0.0
    return mean, max(sd, 0.5 / statistics.median(times))


def tolerance_epochs(times: Sequence[int], rate: float, confidence: float) -> int:
    """E for one threshold reached by every seed in ``times``: the tolerance bound of the
    log-normal fit, and at least the slowest seed's epochs.

    >>> tolerance_epochs([40, 42, 45, 41, 44, 43, 40, 46], 0.01, 0.95)
    54
    """
    mean, sd = fit(times)
    k = tolerance_factor(len(times), rate, confidence)
    return max(math.ceil(math.exp(mean + k * sd) - 1e-9), max(times))


def bound(times: Sequence[int], rate: float, confidence: float) -> Bound:
    """The proposed epochs for one threshold reached by every seed, with their rates."""
    return evaluate(times, tolerance_epochs(times, rate, confidence), confidence)


def evaluate(
    times: Sequence[int | None],
    epochs: int,
    confidence: float,
) -> Bound:
    """The failure rates of ``epochs`` for seeds whose epochs to threshold are ``times``
    (None: never reached). The parametric rates need every seed to have reached it."""
    n = len(times)
    failures = sum(1 for t in times if t is None or t > epochs)
    reached = [t for t in times if t is not None]
    free = clopper_pearson_upper(failures, n, confidence)
    if len(reached) < n or n < 2:
        nan = float("nan")
        slowest = max(reached) if reached else 0
        median = statistics.median(reached) if reached else nan
        return Bound(epochs, median, slowest, nan, nan, nan, nan, failures, free)
    mean, sd = fit(reached)
    z = (math.log(epochs) - mean) / sd
    return Bound(
        epochs=epochs,
        median=statistics.median(reached),
        slowest=max(reached),
        mean_log=mean,
        sd_log=sd,
        estimated_rate=1 - normal_cdf(z),
        upper_rate=tolerance_rate(n, z, confidence),
        failures=failures,
        free_upper_rate=free,
    )
