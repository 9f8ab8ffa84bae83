"""A comparison bound as the action passes it: an empty text is no gate."""

from __future__ import annotations

from dlci.errors import DlciError


def parse_bound(value: str) -> float | None:
    """An empty bound is no gate; anything else a number of 0 or more.

    >>> parse_bound(""), parse_bound("5")
    (None, 5.0)
    """
    if not value.strip():
        return None
    try:
        number = float(value)
    except ValueError:
        number = float("nan")
    if not number >= 0:
        raise DlciError(f"a bound must be a number of 0 or more, got {value[:40]!r}")
    return number
