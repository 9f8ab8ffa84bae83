"""Two samples of per-step figures compared: the change, its interval, and a verdict.

The change is the Hodges-Lehmann shift: the median of every difference ``head_i - base_j``
(of the logarithms for step times, so that the shift is a ratio, shown in percent). Its 95%
interval is the distribution-free one that inverts the Mann-Whitney rank test (Lehmann,
*Nonparametrics*, 1975, ch. 2; Moses' interval): the k-th smallest and k-th largest of those
differences, k read from the exact null distribution of the Mann-Whitney U (its normal
approximation past ``MAX_EXACT`` pairs). Nothing is resampled, so the same samples always
give the same answer.

The interval assumes the two runs differ by a shift only. When one run's steps vary far more
than the other's (a rank test on the distances from each run's median), one run was
disturbed, by a loaded machine for instance, and the comparison says so instead of
measuring the disturbance. Every verdict is one of ``ok``, ``regressed``,
``likely regressed``, ``inconclusive`` and ``not gated``; ``regressed`` fails a gate, and so
does ``likely regressed`` where the configuration says so (``block-likely-regressions``).

``likely regressed``: the estimate is worse than the bound and the change is real (the
interval excludes no change; with too few steps for an interval, the one-sided rank test:
every head step worse than every base step, at most a 5% chance when nothing changed), but
the interval still reaches back over the bound. Three noisy steps against three cannot say
"more than 5 points" at 95%, yet a 15-point drop seen on every step is no noise; a gate that
called it "inconclusive" could never fail a pull request's profile (round 4's issue 47).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from functools import lru_cache
from typing import Any

import numpy as np

CONFIDENCE = 0.95
MAX_EXACT = 2500  # pairs (n * m) up to which U's null distribution is counted exactly
MAX_SAMPLES = 2000  # per side: more steps are thinned evenly (4 million pairs at most)
SPREAD_ALPHA = 0.01  # the unequal-spread test's level
MAD_TO_SD = 1.4826  # the MAD of a normal sample times this estimates its standard deviation


@dataclass(frozen=True)
class Judgement:
    """One figure compared: the change (percent or points), its interval, the verdict."""

    verdict: str  # ok, regressed, inconclusive, not gated
    estimate: float | None
    low: float | None
    high: float | None
    n_base: int
    n_head: int
    spread_base: float | None  # robust standard deviation (percent for times, else points)
    spread_head: float | None
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@lru_cache(maxsize=64)
def _u_counts(n: int, m: int) -> tuple[int, ...]:
    """How many orderings of n and m values give U = 0, 1, ..., n*m (exact integers).

    Their generating function is the Gaussian binomial [n+m choose n]_q, the product over
    i of (1 - q^(m+i)) / (1 - q^i); dividing by (1 - q^i) is a running sum.

    >>> _u_counts(2, 2)
    (1, 1, 2, 1, 1)
    """
    poly = [1] + [0] * (n * m)
    for i in range(1, n + 1):
        for k in range(len(poly) - 1, m + i - 1, -1):  # times (1 - q^(m+i))
            poly[k] -= poly[k - m - i]
        for k in range(i, len(poly)):  # divided by (1 - q^i)
            poly[k] += poly[k - i]
    return tuple(poly)


@lru_cache(maxsize=64)
def _u_cdf_table(n: int, m: int) -> tuple[float, ...]:
    """P(U <= u) for u = 0 .. n*m, from the exact counts."""
    total, running, out = math.comb(n + m, n), 0, []
    for count in _u_counts(min(n, m), max(n, m)):
        running += count
        out.append(running / total)
    return tuple(out)


def u_cdf(u: float, n: int, m: int) -> float:
    """P(U <= u) when both samples come from one distribution.

    >>> round(u_cdf(0, 5, 5), 5), round(u_cdf(2, 5, 5), 5)
    (0.00397, 0.01587)
    """
    if u < 0:
        return 0.0
    if n * m <= MAX_EXACT:
        return _u_cdf_table(n, m)[min(math.floor(u), n * m)]
    mean, sd = n * m / 2, math.sqrt(n * m * (n + m + 1) / 12)
    return 0.5 * math.erfc(-(u + 0.5 - mean) / (sd * math.sqrt(2)))


def interval_rank(n: int, m: int, confidence: float = CONFIDENCE) -> int:
    """The k of the interval [d_(k), d_(nm+1-k)] (1-based); 0 when no such interval exists.

    >>> interval_rank(5, 5), interval_rank(3, 3), interval_rank(4, 4)
    (3, 0, 1)
    """
    tail = (1 - confidence) / 2
    if n * m <= MAX_EXACT:
        k = 0
        while k < n * m // 2 and u_cdf(k, n, m) <= tail:
            k += 1
        return k
    z = _normal_quantile(1 - tail)
    return max(math.floor(n * m / 2 - z * math.sqrt(n * m * (n + m + 1) / 12)), 0)


def _normal_quantile(p: float) -> float:
    """The standard normal quantile, by bisection on erfc (no scipy)."""
    lo, hi = -10.0, 10.0
    for _ in range(100):
        mid = (lo + hi) / 2
        if 0.5 * math.erfc(-mid / math.sqrt(2)) < p:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def samples(values: Any, *, log: bool) -> np.ndarray:
    """Finite values as floats (positive ones for a log scale), thinned to MAX_SAMPLES."""
    x = np.asarray([v for v in values if v is not None], dtype=float)
    x = x[np.isfinite(x) & (x > 0)] if log else x[np.isfinite(x)]
    if x.size > MAX_SAMPLES:
        x = x[np.linspace(0, x.size - 1, MAX_SAMPLES).round().astype(int)]
    out: np.ndarray = np.log(x) if log else x
    return out


def shift(base: np.ndarray, head: np.ndarray) -> tuple[float, float | None, float | None]:
    """The Hodges-Lehmann shift of head from base and its 95% interval (None, None: too few).

    >>> shift(np.array([1.0, 2, 3, 4, 5]), np.array([11.0, 12, 13, 14, 15]))
    (10.0, 7.0, 13.0)
    """
    diffs = np.subtract.outer(head, base).ravel()
    k = interval_rank(base.size, head.size)
    estimate = float(np.median(diffs))
    if k < 1:
        return estimate, None, None
    part = np.partition(diffs, (k - 1, diffs.size - k))
    return estimate, float(part[k - 1]), float(part[diffs.size - k])


def spread(x: np.ndarray) -> float:
    """A robust standard deviation: the median absolute deviation, scaled."""
    return float(MAD_TO_SD * np.median(np.abs(x - np.median(x)))) if x.size else 0.0


def unequal_spread(base: np.ndarray, head: np.ndarray) -> float:
    """The two-sided p-value that both runs' steps scatter alike (Mann-Whitney on the
    distances from each run's own median)."""
    a, b = np.abs(base - np.median(base)), np.abs(head - np.median(head))
    u = float(np.sum(b[:, None] > a[None, :]) + 0.5 * np.sum(b[:, None] == a[None, :]))
    n, m = a.size, b.size
    tail = min(u_cdf(u, n, m), u_cdf(n * m - u, n, m))
    return min(1.0, 2 * tail)


def one_sided_p(base: np.ndarray, head: np.ndarray, worse: int) -> float:
    """The chance, when nothing changed, of head's steps ranking this far in the bad direction
    (exact Mann-Whitney, one-sided).

    >>> one_sided_p(np.array([1.0, 2, 3]), np.array([4.0, 5, 6]), 1)  # 1 of C(6, 3) orders
    0.05
    """
    a, b = (base, head) if worse > 0 else (head, base)
    u = float(np.sum(a[:, None] > b[None, :]) + 0.5 * np.sum(a[:, None] == b[None, :]))
    return u_cdf(u, a.size, b.size)


def _unit(value: float, log: bool) -> float:
    """A difference of logs as percent, of values as it is (a ratio past e^700, which only
    subnormal step times give, is shown as that: never an overflow)."""
    return 100.0 * math.expm1(max(min(value, 700.0), -700.0)) if log else value


def judge(
    base_values: Any,
    head_values: Any,
    *,
    bound: float | None,
    log: bool,
    worse: int,
    floor: float,
) -> Judgement:
    """Compare two runs' per-step values against ``bound`` (None: measure, do not gate).

    ``log``: compare ratios (step times; the change in percent), else differences (points).
    ``worse``: +1 when an increase is a regression (time), -1 when a decrease is (utilization).
    ``floor``: a spread (percent or points) under which unequal spreads do not matter.
    """
    base, head = samples(base_values, log=log), samples(head_values, log=log)
    n, m = base.size, head.size
    if n < 2 or m < 2:
        reason = f"too few profiled steps ({n} and {m})"
        return Judgement("inconclusive", None, None, None, n, m, None, None, reason)
    est, lo, hi = shift(base, head)
    scale = 100.0 if log else 1.0
    found: dict[str, Any] = {
        "estimate": _unit(est, log),
        "low": None if lo is None else _unit(lo, log),
        "high": None if hi is None else _unit(hi, log),
        "n_base": n,
        "n_head": m,
        "spread_base": scale * spread(base),
        "spread_head": scale * spread(head),
    }
    verdict, reason = _decide(found, base, head, bound=bound, log=log, worse=worse, floor=floor)
    return Judgement(verdict, reason=reason, **found)


def _decide(
    found: dict[str, Any],
    base: np.ndarray,
    head: np.ndarray,
    *,
    bound: float | None,
    log: bool,
    worse: int,
    floor: float,
) -> tuple[str, str]:
    """The verdict and its reason, from the first rule that applies."""
    unit = "%" if log else " pt"
    low, high = found["low"], found["high"]
    s_base, s_head = found["spread_base"], found["spread_head"]
    scatter = f"base ±{s_base:.1f}{unit}, head ±{s_head:.1f}{unit}"
    if (low is None or high is None) and bound is not None:
        bad = found["estimate"] * (1 if worse > 0 else -1)
        if bad > bound and one_sided_p(base, head, worse) <= 1 - CONFIDENCE:
            return "likely regressed", (
                f"worse by {bad:.1f}{unit}, beyond the bound of {bound:g}{unit}, on every "
                f"profiled step ({base.size} and {head.size}: a one-sided rank test's "
                f"p = {one_sided_p(base, head, worse):.3f}); too few steps for a "
                f"{CONFIDENCE:.0%} interval: profile at least 4 steps on each side"
            )
    if low is None or high is None:
        return "inconclusive", (
            f"too few profiled steps ({base.size} and {head.size}) for a {CONFIDENCE:.0%} "
            "interval of the change: profile at least 4 steps on each side"
        )
    if max(s_base, s_head) > floor and unequal_spread(base, head) < SPREAD_ALPHA:
        return "inconclusive", (
            f"the runs' steps scatter unequally ({scatter}): one run was disturbed (a loaded "
            "machine?), so their difference is not the change's"
        )
    interval = f"{CONFIDENCE:.0%} interval {low:+.1f}{unit} to {high:+.1f}{unit}"
    if bound is None:
        return "not gated", interval
    # the change in the bad direction: at least (the interval's near end), at most (far end)
    least, most = (low, high) if worse > 0 else (-high, -low)
    if least > bound:
        return "regressed", f"worse by more than {bound:g}{unit} ({interval})"
    if most <= bound:
        return "ok", f"within {bound:g}{unit} ({interval})"
    bad = found["estimate"] * (1 if worse > 0 else -1)
    if bad > bound and least > 0:
        return "likely regressed", (
            f"worse by {bad:.1f}{unit}, beyond the bound of {bound:g}{unit}, and the {interval} "
            f"excludes no change; it still reaches the bound ({scatter}): more steps on both "
            "sides would make it certain"
        )
    return "inconclusive", (
        f"the {interval} includes the bound of {bound:g}{unit}: the steps vary too much "
        f"({scatter}) to tell with this many steps; profile more steps"
    )
