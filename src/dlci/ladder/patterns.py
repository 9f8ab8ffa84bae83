"""The GPU name patterns of a ladder's hardware classes: checked before any is matched.

A pattern comes from a ladder file, which a pull request can propose, and is matched against
the GPU's name. Python's ``re`` has no time limit, so a pattern with catastrophic
backtracking (``(a+)+$``, ``(x|x)*y``) could hang the host step that picks the tier. What a
GPU name pattern needs is small: literals, classes, optional parts, alternatives and simple
repetition. So a pattern is refused, with its key and a hint, when

- it is longer than ``MAX_PATTERN`` characters;
- a repeated part itself contains a repetition or an alternative (the shapes that backtrack
  exponentially: nested quantifiers and repeated alternatives);
- its repetitions, taken together, leave too many ways to split a name: each repetition
  can take up to ``MAX_NAME`` characters (``*``, ``+``, ``{n,}``) or ``high - low + 1``
  counts (``{2,5}``), and their product may not pass ``MAX_CHOICES`` (two ``.*`` pass,
  ``a*a*a*b`` does not: it backtracks polynomially, to the power of their number);
- it uses a back-reference or a conditional group (never needed for a name).

Names are cut to ``MAX_NAME`` characters before matching, so what is left, searched from each start,
costs at most about ``MAX_NAME * MAX_CHOICES`` steps: well under a second.
"""

from __future__ import annotations

import re
import sys
from typing import Any

MAX_PATTERN = 200
MAX_NAME = 128
MAX_CHOICES = 10 * (MAX_NAME + 1) ** 2
HINT = (
    "a GPU name pattern needs only literals, classes like [0-9], '?', alternatives and at "
    "most a couple of '.*'; quote it with single quotes in YAML so backslashes survive"
)

if sys.version_info >= (3, 11):
    from re import _constants as _c
    from re import _parser as _sre
else:  # pragma: no cover - Python 3.10
    import sre_constants as _c
    import sre_parse as _sre

_REPEATS = {_c.MAX_REPEAT, _c.MIN_REPEAT}
# what a GPU name pattern may use; anything else (atomic groups, possessive repeats,
# look-behinds, back-references, conditional groups) is refused by name
_ATOMS = {_c.LITERAL, _c.NOT_LITERAL, _c.ANY, _c.IN, _c.AT}
_NAMES = {
    getattr(_c, "ATOMIC_GROUP", None): "an atomic group",
    getattr(_c, "POSSESSIVE_REPEAT", None): "a possessive repetition",
    _c.GROUPREF: "a back-reference",
    _c.GROUPREF_EXISTS: "a conditional group",
}


def problem(pattern: str) -> str | None:
    """Why ``pattern`` may not be used as a GPU name pattern, or None when it may.

    >>> problem(r"A100|A800") is None
    True
    >>> problem(r"H100.*(SXM|PCIe)?") is None
    True
    >>> problem(r"(a+)+$")
    'a repeated part contains a repetition (nested quantifiers backtrack exponentially)'
    >>> problem(r"(A|A)*B")
    'a repeated part contains alternatives (repeated alternatives backtrack exponentially)'
    >>> problem(r"(A)\\1")
    'it uses a back-reference'
    >>> problem(r"a*a*a*b")[:48]
    'its repetitions leave too many ways to match a n'
    >>> problem(r"V100(?!(a+)+b)")
    'a repeated part contains a repetition (nested quantifiers backtrack exponentially)'
    """
    if len(pattern) > MAX_PATTERN:
        return f"it is {len(pattern)} characters long (at most {MAX_PATTERN})"
    try:
        tree = _sre.parse(pattern, re.IGNORECASE)
        re.compile(pattern, re.IGNORECASE)  # what parses may still not compile
    except re.error as exc:
        return f"it is not a valid regular expression ({exc})"
    except RecursionError:
        return "it nests too deeply"
    found = _walk(tree.data, inside_repeat=False)
    if found:
        return found
    choices = _choices(tree.data)
    if choices > MAX_CHOICES:
        return (
            f"its repetitions leave too many ways to match a name (about {choices:.2g}, "
            f"at most {MAX_CHOICES}): each one multiplies the time a failing match takes"
        )
    return None


def _choices(items: list[Any]) -> int:
    total = 1
    for op, arg in items:
        if op in _REPEATS:
            low, high = arg[0], min(arg[1], MAX_NAME)
            total *= max(high - low + 1, 1) * _choices(list(arg[2]))
        elif op == _c.BRANCH:
            total *= sum(_choices(list(branch)) for branch in arg[1])
        elif op in (_c.SUBPATTERN, _c.ASSERT, _c.ASSERT_NOT):
            total *= _choices(list(arg[-1]))
    return total


def _walk(items: list[Any], *, inside_repeat: bool) -> str | None:
    for op, arg in items:
        if op in _ATOMS:
            continue
        if op in _REPEATS:
            _low, high, sub = arg
            if inside_repeat:
                return (
                    "a repeated part contains a repetition "
                    "(nested quantifiers backtrack exponentially)"
                )
            found = _walk(list(sub), inside_repeat=high > 1)
        elif op == _c.BRANCH:
            if inside_repeat:
                return (
                    "a repeated part contains alternatives "
                    "(repeated alternatives backtrack exponentially)"
                )
            found = next(
                (f for b in arg[1] if (f := _walk(list(b), inside_repeat=inside_repeat))), None
            )
        elif op == _c.SUBPATTERN:
            found = _walk(list(arg[-1]), inside_repeat=inside_repeat)
        elif op in (_c.ASSERT, _c.ASSERT_NOT):
            if arg[0] < 0:
                return "it uses a look-behind"
            found = _walk(list(arg[-1]), inside_repeat=inside_repeat)
        else:
            return f"it uses {_NAMES.get(op, str(op).lower().replace('_', ' '))}"
        if found:
            return found
    return None


def search(pattern: str, name: str) -> re.Match[str] | None:
    """``re.search`` of a checked pattern in a GPU name cut to ``MAX_NAME`` characters."""
    return re.search(pattern, name[:MAX_NAME], flags=re.IGNORECASE)
