"""What a failed curve says: still falling steadily (and when it would arrive), or noisy.

A healthy model fine-tuned at 5e-5 is still falling steadily when a short tier ends; a broken
one flattened out long before. The difference is in the curve's last third: a steady fall of
the smoothed relative loss, fitted as log-linear in the step, projects the step at which the
goal would be reached. A curve whose step-to-step jumps are large against its fall is noisy:
its verdict rests on draws, and the report says so.
"""

from __future__ import annotations

import itertools
import math
import statistics
from dataclasses import dataclass

STEADY_SHARE = 0.7  # of the last third's steps, the smoothed curve went down at least this often
STEADY_PACE = 0.25  # the last third fell at least this share of the whole run's average pace
STEADY_FALL = 0.99  # and ended at or below this share of where it began
NOISY = 0.25  # median step-to-step jump, as a share of the curve's fall, past which it is noisy
PROJECTION_LIMIT = 100  # a projection past this many times the tier's epochs is not given
# the engine's early stops of a run that cannot pass, counted in steps (never seconds):
# a loss that has not moved at all in FLAT_STEPS steps on replayed draws will not move (frozen,
# lr 0, a step that never steps); a judged loss that did not close PLATEAU_GAIN of its
# remaining distance to the floor in PLATEAU_STEPS steps has flattened out above the goal (a
# healthy slow learner near its goal still closes 10-15% of it in that many steps)
FLAT_STEPS = 25
FLAT_TOLERANCE = 1e-6  # of the start's size
PLATEAU_STEPS = 150
PLATEAU_GAIN = 0.02


@dataclass(frozen=True)
class Shape:
    still_falling: bool
    projected_step: int | None  # where the fitted fall reaches the goal; None: not projected
    noisy: bool
    jump: float  # median step-to-step jump of the relative curve (a share of the reference)


def medians(values: list[float], width: int = 3) -> list[float]:
    """A running median over ``width`` values (the first ones over what there is).

    >>> medians([1.0, 5.0, 2.0, 3.0])
    [1.0, 3.0, 2.0, 3.0]
    """
    out = []
    for end in range(1, len(values) + 1):
        window = values[max(0, end - width) : end]
        out.append(statistics.median(window))
    return out


def read(relative: list[float], limit: float, epochs: int) -> Shape:
    """The shape of a relative curve (step 2 onwards, shares of the reference above the
    floor) against the goal ``limit``.

    >>> steady = [0.9 * 0.99 ** i for i in range(100)]
    >>> shape = read(steady, 0.3, 100)
    >>> shape.still_falling, shape.projected_step, shape.noisy
    (True, 113, False)
    >>> read([0.6 + 0.01 * (i % 2) for i in range(100)], 0.3, 100).still_falling
    False
    """
    finite = [v for v in relative if math.isfinite(v)]
    if len(finite) < 12:
        return Shape(False, None, False, 0.0)
    jumps = [abs(b - a) for a, b in itertools.pairwise(finite)]
    jump = statistics.median(jumps)
    fall = max(finite[0] - min(finite), 1e-12)
    noisy = jump > NOISY * fall or jump > NOISY
    smooth = medians(finite)
    tail = smooth[-max(len(smooth) // 3, 10) :]
    downs = sum(1 for a, b in itertools.pairwise(tail) if b <= a)
    pace = (smooth[0] - smooth[-1]) / max(len(smooth) - 1, 1)
    tail_pace = (tail[0] - tail[-1]) / max(len(tail) - 1, 1)
    steady = (
        tail[-1] <= STEADY_FALL * tail[0]
        and pace > 0
        and tail_pace >= STEADY_PACE * pace
        and downs >= STEADY_SHARE * (len(tail) - 1)
        and limit < tail[-1] < 1.0  # below the reference already: it learns, and slowly
    )
    projected = _project(tail, limit, len(relative) + 1, epochs) if steady else None
    return Shape(steady, projected, noisy, jump)


def _project(tail: list[float], limit: float, last_step: int, epochs: int) -> int | None:
    """The step at which a log-linear fit of ``tail`` (ending at ``last_step``) reaches
    ``limit``; None past PROJECTION_LIMIT times ``epochs``."""
    points = [(i, math.log(v)) for i, v in enumerate(tail) if v > 0]
    if len(points) < 3:
        return None
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    if slope >= 0:
        return None
    now = my + slope * (len(tail) - 1 - mx)
    more = (math.log(limit) - now) / slope
    step = last_step + max(0, math.ceil(more))
    return step if step <= PROJECTION_LIMIT * epochs else None
