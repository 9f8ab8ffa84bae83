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
        "median_us": us(np.median(values)),
        "p95_us": us(np.percentile(values, 95)),
    }
