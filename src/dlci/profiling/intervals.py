"""Unions of time intervals with numpy: the arithmetic under every utilization number.

An interval set is a pair of arrays ``(starts, ends)``, merged (sorted, disjoint) unless a
function says otherwise.

>>> import numpy as np
>>> s, e = merge(np.array([0.0, 5.0, 2.0]), np.array([3.0, 6.0, 4.0]))
>>> s.tolist(), e.tolist()
([0.0, 5.0], [4.0, 6.0])
>>> length(s, e)
5.0
>>> length(*clip(s, e, 1.0, 5.5))
3.5
"""

from __future__ import annotations

import heapq
import itertools
from typing import Any

import numpy as np

Pair = tuple[Any, Any]


def empty() -> Pair:
    return np.empty(0), np.empty(0)


def merge(starts: Any, ends: Any) -> Pair:
    """Sorted, disjoint intervals covering the same time as the inputs."""
    starts = np.asarray(starts, dtype=np.float64)
    ends = np.asarray(ends, dtype=np.float64)
    if starts.size == 0:
        return empty()
    keep = ends > starts
    starts, ends = starts[keep], ends[keep]
    if starts.size == 0:
        return empty()
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], ends[order]
    reach = np.maximum.accumulate(e)
    new = np.empty(s.size, dtype=bool)
    new[0] = True
    new[1:] = s[1:] > reach[:-1]
    first = np.flatnonzero(new)
    last = np.append(first[1:] - 1, s.size - 1)
    return s[first], reach[last]


def length(starts: Any, ends: Any) -> float:
    """Total time of merged intervals."""
    return float(np.sum(ends - starts)) if len(starts) else 0.0


def clip(starts: Any, ends: Any, lo: float, hi: float) -> Pair:
    """Merged intervals restricted to ``[lo, hi]``."""
    if not len(starts) or hi <= lo:
        return empty()
    i = int(np.searchsorted(ends, lo, side="right"))
    j = int(np.searchsorted(starts, hi, side="left"))
    s = np.clip(starts[i:j], lo, hi)
    e = np.clip(ends[i:j], lo, hi)
    keep = e > s
    return s[keep], e[keep]


def union(*sets: Pair) -> Pair:
    """Merged union of merged sets."""
    parts = [pair for pair in sets if len(pair[0])]
    if not parts:
        return empty()
    if len(parts) == 1:
        return parts[0]
    return merge(np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]))


def overlap(a: Pair, b: Pair) -> float:
    """Time covered by both merged sets."""
    return length(*a) + length(*b) - length(*union(a, b))


def gaps(starts: Any, ends: Any, lo: float, hi: float) -> Pair:
    """The complement of merged intervals within ``[lo, hi]``."""
    s, e = clip(starts, ends, lo, hi)
    gap_starts = np.concatenate(([lo], e))
    gap_ends = np.concatenate((s, [hi]))
    keep = gap_ends > gap_starts
    return gap_starts[keep], gap_ends[keep]


def innermost(sets: dict[str, Pair]) -> dict[str, Pair]:
    """Each name's share of the time where ``sets`` (raw, possibly nested intervals per name)
    overlap, the innermost interval winning: of those covering an instant, the one that
    started last (for nested intervals, the inner one). Merged sets, disjoint across names.

    >>> import numpy as np
    >>> opt = (np.array([10.0]), np.array([90.0]))  # Optimizer.step running a closure
    >>> fwd = (np.array([15.0]), np.array([45.0]))
    >>> {k: [x.tolist() for x in v] for k, v in innermost({"opt": opt, "fwd": fwd}).items()}
    {'opt': [[10.0, 45.0], [15.0, 90.0]], 'fwd': [[15.0], [45.0]]}
    """
    names = list(sets)
    items = sorted(
        (float(a), float(b), k)
        for k, name in enumerate(names)
        for a, b in zip(*sets[name], strict=True)
        if b > a
    )
    points = sorted({t for a, b, _ in items for t in (a, b)})
    owned: list[tuple[list[float], list[float]]] = [([], []) for _ in names]
    active: list[tuple[float, float, int]] = []  # (-start, end, name index): latest start on top
    i = 0
    for left, right in itertools.pairwise(points):
        while i < len(items) and items[i][0] <= left:
            heapq.heappush(active, (-items[i][0], items[i][1], items[i][2]))
            i += 1
        while active and active[0][1] <= left:  # ended: the heap's top only (lazy removal)
            heapq.heappop(active)
        if active:
            owner = owned[active[0][2]]
            owner[0].append(left)
            owner[1].append(right)
    return {
        name: merge(np.array(a), np.array(b)) for name, (a, b) in zip(names, owned, strict=True)
    }


def clipped_lengths(starts: Any, ends: Any, lo: Any, hi: Any) -> Any:
    """Length of merged intervals within each window ``[lo[i], hi[i]]``, all at once.

    >>> import numpy as np
    >>> s, e = np.array([0.0, 5.0]), np.array([4.0, 6.0])
    >>> clipped_lengths(s, e, np.array([1.0, 3.5]), np.array([5.5, 10.0])).tolist()
    [3.5, 1.5]
    """
    lo = np.asarray(lo, dtype=np.float64)
    hi = np.asarray(hi, dtype=np.float64)
    return _covered_before(starts, ends, hi) - _covered_before(starts, ends, lo)


def _covered_before(starts: Any, ends: Any, x: Any) -> Any:
    """Time covered by merged intervals before each instant in ``x``."""
    if not len(starts):
        return np.zeros(len(x))
    prefix = np.concatenate(([0.0], np.cumsum(ends - starts)))
    j = np.searchsorted(starts, x, side="left")  # intervals that start before x
    total = prefix[j]
    last = np.clip(j - 1, 0, None)
    over = np.where(j > 0, np.maximum(ends[last] - x, 0.0), 0.0)
    return total - over


def priority_lengths(lo: Any, hi: Any, ordered: list[tuple[str, Pair]]) -> dict[str, Any]:
    """``priority_split`` for many windows at once: an array per name.

    >>> import numpy as np
    >>> a = (np.array([0.0]), np.array([4.0]))
    >>> b = (np.array([2.0]), np.array([6.0]))
    >>> {k: v.tolist() for k, v in priority_lengths([0.0, 5.0], [5.0, 10.0],
    ...                                              [("a", a), ("b", b)]).items()}
    {'a': [4.0, 0.0], 'b': [1.0, 1.0], 'other': [0.0, 4.0]}
    """
    lo = np.asarray(lo, dtype=np.float64)
    hi = np.asarray(hi, dtype=np.float64)
    covered = empty()
    before = np.zeros(lo.size)
    out: dict[str, Any] = {}
    for name, pair in ordered:
        covered = union(covered, pair)
        now = clipped_lengths(*covered, lo, hi)
        out[name] = now - before
        before = now
    out["other"] = np.maximum(hi - lo - before, 0.0)
    return out


def priority_split(
    window: tuple[float, float], ordered: list[tuple[str, Pair]]
) -> dict[str, float]:
    """Assign each instant of ``window`` to the first set that covers it; the rest is other.

    >>> import numpy as np
    >>> a = (np.array([0.0]), np.array([4.0]))
    >>> b = (np.array([2.0]), np.array([6.0]))
    >>> priority_split((0.0, 10.0), [("a", a), ("b", b)])
    {'a': 4.0, 'b': 2.0, 'other': 4.0}
    """
    return {k: float(v[0]) for k, v in priority_lengths([window[0]], [window[1]], ordered).items()}
