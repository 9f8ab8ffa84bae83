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


def difference(a: Pair, b: Pair) -> Pair:
    """The part of merged set ``a`` that merged set ``b`` does not cover (merged).

    >>> import numpy as np
    >>> a = (np.array([0.0, 20.0]), np.array([10.0, 30.0]))
    >>> b = (np.array([2.0, 8.0]), np.array([4.0, 25.0]))
    >>> [x.tolist() for x in difference(a, b)]
    [[0.0, 4.0, 25.0], [2.0, 8.0, 30.0]]
    """
    if not len(a[0]) or not len(b[0]):
        return a
    holes = gaps(*b, float(a[0][0]), float(a[1][-1]))  # the complement of b over a's span
    # a and holes are merged, sorted and disjoint: their intersection is where both cover,
    # found by a sweep over the boundaries (+1 at a start, -1 at an end; ends first on ties)
    points = np.concatenate((a[0], a[1], holes[0], holes[1]))
    deltas = np.concatenate(
        (np.ones(a[0].size), -np.ones(a[1].size), np.ones(holes[0].size), -np.ones(holes[1].size))
    )
    order = np.lexsort((deltas, points))
    points, depth = points[order], np.cumsum(deltas[order])
    both = np.flatnonzero(depth[:-1] == 2)
    keep = points[both + 1] > points[both]
    return merge(points[both][keep], points[both + 1][keep])


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
