"""How the report rounds: microseconds to the nanosecond, shares to 4 decimals of a percent.

>>> us(1.23456), pct(1, 3), pct(1, 0)
(1.235, 33.3333, 0.0)
"""

from __future__ import annotations

from typing import Any

import numpy as np


def pct(part: float, whole: float) -> float:
    """``part`` as a percentage of ``whole`` (0 when ``whole`` is not positive)."""
    return round(float(100.0 * part / whole), 4) if whole > 0 else 0.0


def us(value: Any) -> float:
    """A time in microseconds, rounded to the nanosecond."""
    return round(float(value), 3)


def stats(values: Any) -> dict[str, float]:
    """Count, mean, median and 95th percentile of durations in microseconds."""
    if not len(values):
        return {"count": 0, "mean_us": 0.0, "median_us": 0.0, "p95_us": 0.0}
    return {
        "count": len(values),
        "mean_us": us(np.mean(values)),
        "median_us": us(percentile(values, 50)),
        "p95_us": us(percentile(values, 95)),
    }


def percentile(values: Any, q: float) -> float:
    """numpy's default (linear) percentile of a non-empty array, without np.percentile and
    np.median: both import numpy.ma, a sixth of ``dlci analyze``'s start-up on a small trace.

    >>> percentile(np.array([4.0, 1.0, 3.0, 2.0]), 50), percentile(np.array([1.0, 2.0]), 95)
    (2.5, 1.95)
    """
    ordered = np.sort(np.asarray(values, dtype=np.float64), kind="stable")
    at = (ordered.size - 1) * q / 100.0
    low = int(at)
    high = min(low + 1, ordered.size - 1)
    return float(ordered[low] + (ordered[high] - ordered[low]) * (at - low))
