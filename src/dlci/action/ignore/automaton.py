"""A ``.dockerignore`` pattern's regular expression run as an automaton: time linear in the path.

``rules.py`` turns each pattern into the regular expression the engine builds (moby's
patternmatcher). Python's ``re`` runs it by backtracking, exponential in the path for
``**/**/**/x`` and polynomial for ``*a*a*a*b``; Go's regexp, which the engine runs, is
linear. Here the same expression, parsed by the parser ``re.compile`` runs (so a class, an
escape or an anchor means what it meant to ``re``), becomes a program of single-character
tests, splits and anchors, run as a DFA built lazily, one state per set of program
positions, the way RE2 runs one. A match of ``n`` characters costs at most
``(n + 1) * (len(program) + 1)`` steps, and one step per character once its states are
built; the states built for one ignore file draw on one :class:`Work` budget, so a hostile
file ends in a clear error, never in hours, and the cached states stay within a bound.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from typing import Any

if sys.version_info >= (3, 11):
    from re import _constants as sre
    from re import _parser as sre_parse
else:  # pragma: no cover - the same parser under its old names
    import sre_constants as sre
    import sre_parse

STEP_LIMIT = 20_000_000  # program positions visited to build states, per ignore file
CACHE_LIMIT = 2_000_000  # cached transitions and state positions, per ignore file
CHAR, SPLIT, JMP, ASSERT, MATCH = range(5)
DEAD, MATCHED = -1, -2  # no match possible; a match already (a prefix matched)
_WORD = re.compile(r"\w")  # what \b tests, as re tests it
_ANCHORS = {
    sre.AT_BEGINNING,
    sre.AT_BEGINNING_STRING,
    sre.AT_END_STRING,
    sre.AT_BOUNDARY,
    sre.AT_NON_BOUNDARY,
}
_CATEGORY_ESCAPES = {
    items[0][1]: escape
    for escape, (op, items) in sre_parse.CATEGORIES.items()
    if op is sre.IN and isinstance(items, list)
}
State = tuple[tuple[int, ...], bool, bool]  # program positions, at the start, after a \w


class WorkLimit(Exception):
    """The patterns of one ignore file needed more work than :data:`STEP_LIMIT`."""


class Work:
    """The steps the automata of one ignore file may spend building states, and the states
    they may keep cached (past the bound, all their caches are dropped and rebuilt)."""

    def __init__(self) -> None:
        self.limit, self.cache_limit = STEP_LIMIT, CACHE_LIMIT
        self.left, self.cached = self.limit, 0
        self.automata: list[Automaton] = []

    def spend(self, steps: int) -> None:
        self.left -= steps
        if self.left < 0:
            raise WorkLimit(f"matching its patterns took more than {self.limit:,} steps")

    def trim(self) -> None:
        for automaton in self.automata:
            automaton.forget()
        self.cached = 0


class Automaton:
    """The regular expression ``regex`` as a lazily built DFA; ``re.error`` for a construct a
    ``.dockerignore`` pattern cannot produce, or one no automaton runs (a back-reference).

    >>> a = Automaton(r"^(.*/)?(.*/)?[^/]*a[^/]*b\\Z")
    >>> a.matches("x/y/zab"), a.matches("x/ab/c"), a.matches("ba")
    (True, False, False)
    """

    def __init__(self, regex: str, work: Work | None = None) -> None:
        self.source = regex
        self.ops: list[int] = []
        self.args: list[Any] = []
        self.boundary = False  # whether a state must remember if it follows a \w
        self._emit(sre_parse.parse(regex).data)
        self._add(MATCH, None)
        self.steps = 0  # every step taken, for tests: characters read, positions visited
        self.work = work or Work()
        self.work.automata.append(self)
        self.forget()

    def forget(self) -> None:
        """Drop the cached states (the budget's bound on memory)."""
        self._ids: dict[State, int] = {}
        self._states: list[State] = []
        self._next: list[dict[str, int]] = []
        self._accepts: list[bool | None] = []
        self._intern(((0,), True, False))

    def matches(self, text: str) -> bool:
        """What ``re.compile(regex).match(text) is not None`` says, in linear time."""
        if self.work.cached > self.work.cache_limit:
            self.work.trim()
        state, nexts, self.steps = 0, self._next, self.steps + len(text)
        for char in text:  # the hot loop: one look-up a character once the states exist
            after = nexts[state].get(char)
            if after is None:
                after = nexts[state][char] = self._step(state, char)
                self.work.cached += 1
            if after < 0:
                return after == MATCHED
            state = after
        accepts = self._accepts[state]
        if accepts is None:
            accepts = self._accepts[state] = self._closure(self._states[state], None)[1]
        return accepts

    # ------------------------------------------------------------------------ the program

    def _add(self, op: int, arg: Any) -> int:
        self.ops.append(op)
        self.args.append(arg)
        return len(self.ops) - 1

    def _emit(self, items: Any) -> None:
        for op, arg in items:
            if op in (sre.LITERAL, sre.NOT_LITERAL, sre.ANY, sre.IN):
                self._add(CHAR, _predicate(op, arg))
            elif op is sre.SUBPATTERN and not (arg[1] or arg[2]):  # a group, no flags
                self._emit(arg[3])
            elif op is sre.MAX_REPEAT and arg[0] == 0 and arg[1] in (1, sre.MAXREPEAT):
                split = self._add(SPLIT, None)  # "?" or "*": the body, or past it
                self._emit(arg[2])
                if arg[1] == sre.MAXREPEAT:
                    self._add(JMP, split)
                self.args[split] = (split + 1, len(self.ops))
            elif op is sre.AT and arg in _ANCHORS:
                self.boundary |= arg in (sre.AT_BOUNDARY, sre.AT_NON_BOUNDARY)
                self._add(ASSERT, arg)
            elif op is sre.GROUPREF:
                raise re.error("a back-reference (Go's regexp, the engine's, has none)")
            else:
                raise re.error(f"{op} {arg}: not a construct of a .dockerignore pattern")

    # ------------------------------------------------------------------------- the states

    def _intern(self, state: State) -> int:
        known = self._ids.get(state)
        if known is None:
            known = self._ids[state] = len(self._states)
            self._states.append(state)
            self._next.append({})
            self._accepts.append(None)
            self.work.cached += len(state[0]) + 1
        return known

    def _step(self, state: int, char: str) -> int:
        """The state after ``char``, DEAD, or MATCHED."""
        chars, matched = self._closure(self._states[state], char)
        if matched:
            return MATCHED
        after = tuple(sorted({pc + 1 for pc in chars if self.args[pc](char)}))
        if not after:
            return DEAD
        return self._intern((after, False, self.boundary and _is_word(char)))

    def _closure(self, state: State, ahead: str | None) -> tuple[list[int], bool]:
        """The character tests reachable from ``state`` before ``ahead`` (None: the end), and
        whether the match is reached; each position is visited once."""
        positions, at_start, after_word = state
        seen: set[int] = set()
        pending, chars, matched = list(positions), [], False
        while pending:
            pc = pending.pop()
            if pc in seen:
                continue
            seen.add(pc)
            op, arg = self.ops[pc], self.args[pc]
            if op == CHAR:
                chars.append(pc)
            elif op == MATCH:
                matched = True
            elif op == JMP:
                pending.append(arg)
            elif op == SPLIT:
                pending.extend(arg)
            elif _holds(arg, at_start, after_word, ahead):
                pending.append(pc + 1)
        self.steps += len(seen)
        self.work.spend(len(seen))
        return chars, matched


def _holds(anchor: Any, at_start: bool, after_word: bool, ahead: str | None) -> bool:
    """An anchor at a position, as ``re`` decides it (``\\b`` never holds in an empty text)."""
    if anchor in (sre.AT_BEGINNING, sre.AT_BEGINNING_STRING):
        return at_start
    if anchor is sre.AT_END_STRING:
        return ahead is None
    if at_start and ahead is None:
        return False
    return (after_word != _is_word(ahead)) == (anchor is sre.AT_BOUNDARY)


def _is_word(char: str | None) -> bool:
    return char is not None and _WORD.match(char) is not None


def _predicate(op: Any, arg: Any) -> Callable[[str], bool]:
    """One character's test: a literal, its negation, ``.``, or a class (run by ``re``)."""
    if op is sre.LITERAL:
        return chr(arg).__eq__
    if op is sre.NOT_LITERAL:
        return chr(arg).__ne__
    if op is sre.ANY:
        return "\n".__ne__
    parts = []
    for kind, value in arg:
        if kind is sre.NEGATE:
            parts.append("^")
        elif kind is sre.LITERAL:
            parts.append(f"\\U{value:08x}")
        elif kind is sre.RANGE:
            parts.append(f"\\U{value[0]:08x}-\\U{value[1]:08x}")
        elif kind is sre.CATEGORY:
            parts.append(_CATEGORY_ESCAPES[value])
        else:
            raise re.error(f"{kind} in a class: not a construct of a .dockerignore pattern")
    test = re.compile("[" + "".join(parts) + "]")
    return lambda char: test.fullmatch(char) is not None
