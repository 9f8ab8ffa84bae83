"""Declared shapes, checked with every mistake located: the one schema layer (issue 45).

A shape is a msgspec ``Struct``: each field states its type, its bounds, its meaning
(``Meta(description=...)``) and a fix-it hint (``Meta(extra={"hint": ...})``) once. From the
same class msgspec writes the JSON schema (:func:`json_schema`), and :func:`check` walks a
decoded document against it and returns *every* problem at once, each with its key path, so a
reader that knows lines (the ladder's YamlSource, the configuration's TomlSource) locates them
all; msgspec's own decoder stops at the first. :class:`Problems` raises them together.

>>> class Row(msgspec.Struct):
...     epochs: int
...     loss: float = 1.0
>>> values, found = check(Row, {"epochs": "ten", "los": 2})
>>> [(p.path, p.message) for p in found]
[(('los',), 'unknown key'), (('epochs',), "expected an integer, got 'ten' (a text)")]
"""

from __future__ import annotations

import datetime as dt
import functools
import itertools
import math
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import msgspec
import msgspec.inspect as mi

from dlci.errors import SHOWN, DlciError

KeyPath = tuple[str | int, ...]
Mismatch = tuple[str, Any, str]  # where, the value found, what was expected


class Problem(msgspec.Struct, frozen=True):
    """One mistake in a document: where (a key path), what, and how to fix it."""

    path: KeyPath
    message: str
    hint: str | None = None


class Problems(DlciError):
    """Every located mistake of one document; the first stands for all in ``message``.

    >>> print(Problems([DlciError("a: bad", file="f", line=1),
    ...                 DlciError("b: worse", file="f", line=2, hint="fix b")]))
    f:1: a: bad
    f:2: b: worse
      hint: fix b
    """

    def __init__(self, errors: Sequence[DlciError]) -> None:
        first = errors[0]
        super().__init__(first.message, hint=first.hint, file=first.file, line=first.line)
        self.errors = tuple(errors)

    def every(self) -> tuple[DlciError, ...]:
        return self.errors

    def __str__(self) -> str:
        shown = [DlciError.__str__(e) for e in self.errors[:SHOWN]]
        if len(self.errors) > SHOWN:
            shown.append(f"and {len(self.errors) - SHOWN} more problems")
        return "\n".join(shown)


def raise_all(errors: Sequence[DlciError]) -> None:
    """Raise nothing, the one error, or all of them as :class:`Problems`."""
    if len(errors) == 1:
        raise errors[0]
    if errors:
        raise Problems(errors)


# --------------------------------------------------------------------------- the declared fields


class Field(msgspec.Struct, frozen=True):
    """One declared field, as the walker, the docs and the messages read it."""

    name: str  # as a document spells it (a kebab-case struct renames its fields)
    type: mi.Type  # without its Metadata wrapper: the constraints live in it
    required: bool
    default: Any  # None when the field has none (or is UNSET when absent)
    description: str
    hint: str
    extra: Mapping[str, Any]  # what else the declaration says (a key's trust, its kind)


@functools.cache
def fields(cls: type[msgspec.Struct]) -> tuple[Field, ...]:
    """The declared fields of ``cls``, in order."""
    info = mi.type_info(cls)
    assert isinstance(info, mi.StructType), cls
    found = []
    for f in info.fields:
        kind, description, extra = f.type, "", {}
        if isinstance(kind, mi.Metadata):
            description = str((kind.extra_json_schema or {}).get("description", ""))
            extra = dict(kind.extra or {})
            kind = kind.type
        default = f.default
        if f.default_factory is not msgspec.NODEFAULT:
            default = f.default_factory()
        default = None if default in (msgspec.NODEFAULT, msgspec.UNSET) else default
        hint = str(extra.pop("hint", ""))
        found.append(Field(f.encode_name, kind, f.required, default, description, hint, extra))
    return tuple(found)


_BOUNDS = {"ge", "gt", "le", "lt", "min_length", "max_length", "pattern"}


def meta(
    description: str, hint: str = "", *, rule: dict[str, Any] | None = None, **more: Any
) -> msgspec.Meta:
    """A field's declaration: its meaning, a fix-it hint, its bounds (ge, gt, le, lt,
    min_length) and anything else its readers need (``trusted=True``), kept in ``extra``.

    ``rule`` is JSON schema for a rule the reader checks itself, in its own words (a waiver's
    reason must hold a letter or digit: ``{"minLength": 1}`` says the least of it).
    """
    bounds = {k: v for k, v in more.items() if k in _BOUNDS}
    extra = {"hint": hint, **{k: v for k, v in more.items() if k not in _BOUNDS}}
    return msgspec.Meta(description=description, extra=extra, extra_json_schema=rule, **bounds)


def json_schema(cls: type[msgspec.Struct]) -> dict[str, Any]:
    """The JSON schema of ``cls`` alone (its properties inline, no title), from msgspec."""
    _, defs = msgspec.json.schema_components([cls])
    schema = dict(defs[cls.__name__])
    schema.pop("title", None)
    return schema


# --------------------------------------------------------------------------- the walker


def check(
    cls: type[msgspec.Struct], raw: Mapping[str, Any], path: KeyPath = ()
) -> tuple[dict[str, Any], list[Problem]]:
    """``raw`` checked against ``cls``: the good values (defaults filled in) and every problem.

    Unknown keys come first (each with the nearest declared one), then the declared fields in
    order: a missing required key, or a value of the wrong type or out of bounds.
    """
    declared = fields(cls)
    found = unknown_keys(raw, [f.name for f in declared], path)
    values: dict[str, Any] = {}
    for f in declared:
        if f.name not in raw:
            if f.required and not misspelt(f.name, raw):
                found.append(
                    Problem(path, f"missing required key '{f.name}'", f"{f.name}: {f.hint}")
                )
            values[f.name] = f.default
            continue
        try:
            values[f.name] = value(f.type, raw[f.name])
        except ValueError as exc:
            found.append(Problem((*path, f.name), str(exc), f.hint or None))
    return values, found


def unknown_keys(
    raw: Mapping[Any, Any], known: Mapping[str, Any] | Sequence[str], path: KeyPath = ()
) -> list[Problem]:
    """Each key of ``raw`` that is not ``known``, with the nearest known one as its hint (for
    the first :data:`SHOWN`: a file of thousands of wrong keys costs no search for each)."""
    found: list[Problem] = []
    for key in raw:
        if key not in known:
            near = len(found) < SHOWN
            hint = suggest(str(key), known, "known keys", near=near)
            found.append(Problem((*path, str(key)), "unknown key", hint))
    return found


def misspelt(name: str, raw: Mapping[Any, Any]) -> bool:
    """Whether a key of ``raw`` is a misspelling of the missing ``name`` (one mistake, whose
    "unknown key" already says "did you mean")."""
    # the first SHOWN other keys: a misspelling is among them in any file a person wrote
    others = itertools.islice((key for key in raw if key != name), SHOWN)
    return any(closest(str(key), [name]) == name for key in others)


def value(kind: mi.Type, data: Any) -> Any:
    """``data`` checked against one declared type and normalised, or ValueError in words.

    >>> value(mi.IntType(ge=1), 3.0), value(mi.FloatType(gt=0), 2)
    (3, 2.0)
    >>> value(mi.IntType(le=10), 11)
    Traceback (most recent call last):
    ValueError: must be at most 10, got 11
    """
    if isinstance(kind, mi.Metadata):
        return value(kind.type, data)
    if isinstance(kind, mi.UnionType):
        if data is None and any(isinstance(t, mi.NoneType) for t in kind.types):
            return None
        kinds = [t for t in kind.types if not isinstance(t, mi.NoneType)]
        if len(kinds) == 1:
            return value(kinds[0], data)
    if isinstance(kind, mi.LiteralType):
        if data in kind.values and type(data) in {type(v) for v in kind.values}:
            return data
        raise ValueError(f"must be {_either(kind.values)}, got {show(data)}")
    expected = words(kind)
    if isinstance(kind, mi.IntType):
        # as in JSON Schema, 100.0 is an integer
        if not _number(data) or (isinstance(data, float) and not data.is_integer()):
            raise ValueError(f"expected {expected}, got {show(data)} ({kind_of(data)})")
        return int(_bounded(kind, data))
    if isinstance(kind, mi.FloatType):
        if not _number(data):
            raise ValueError(f"expected {expected}, got {show(data)} ({kind_of(data)})")
        if not finite(data):
            raise ValueError(f"must be a finite number, got {num(data)}")
        return float(_bounded(kind, data))
    if isinstance(kind, mi.StrType) and isinstance(data, str):
        if kind.min_length and len(data.strip()) < kind.min_length:
            raise ValueError(f"must not be empty, got {show(data)}")
        if kind.pattern and not re.search(kind.pattern, data):
            raise ValueError(f"must match {kind.pattern}, got {show(data)}")
        return data
    if isinstance(kind, mi.DateType):
        return _date(data)
    if isinstance(kind, mi.BoolType) and isinstance(data, bool):
        return data
    if (
        isinstance(kind, mi.ListType)
        and isinstance(data, list)
        and all(_fits(kind.item_type, item) for item in data)
    ):
        return [value(kind.item_type, item) for item in data]
    raise ValueError(f"expected {expected}, got {show(data)} ({kind_of(data)})")


def _date(data: Any) -> dt.date:
    """A date: a TOML date, or its ISO text (a date and time is not a date)."""
    if isinstance(data, dt.date) and not isinstance(data, dt.datetime):
        return data
    if isinstance(data, str) and re.fullmatch(r"\d{4}-\d{2}-\d{2}", data.strip()):
        try:
            return dt.date.fromisoformat(data.strip())
        except ValueError:
            pass
    raise ValueError(f"must be a date, got {show(data)}")


def _fits(kind: mi.Type, data: Any) -> bool:
    try:
        value(kind, data)
    except ValueError:
        return False
    return True


def _bounded(kind: mi.IntType | mi.FloatType, data: float) -> float:
    """``data`` within the declared bounds (compared exactly: no float() of a huge integer)."""
    if kind.ge is not None and data < kind.ge:
        raise ValueError(f"must be at least {num(kind.ge)}, got {num(data)}")
    if kind.gt is not None and data <= kind.gt:
        raise ValueError(f"must be greater than {num(kind.gt)}, got {num(data)}")
    if kind.le is not None and data > kind.le:
        raise ValueError(f"must be at most {num(kind.le)}, got {num(data)}")
    if kind.lt is not None and data >= kind.lt:
        raise ValueError(f"must be less than {num(kind.lt)}, got {num(data)}")
    return data


def words(kind: mi.Type) -> str:
    """What a type expects, in the words of the messages.

    >>> words(mi.ListType(mi.StrType()))
    'a list of texts'
    """
    if isinstance(kind, mi.Metadata):
        return words(kind.type)
    if isinstance(kind, mi.ListType):
        return "a list of " + {"a text": "texts", "a number": "numbers"}.get(
            words(kind.item_type), "values"
        )
    if isinstance(kind, mi.UnionType):
        return " or ".join(words(t) for t in kind.types)
    if isinstance(kind, mi.LiteralType):
        return _either(kind.values)
    return {
        mi.IntType: "an integer",
        mi.FloatType: "a number",
        mi.StrType: "a text",
        mi.BoolType: "true or false",
        mi.NoneType: "nothing",
        mi.DateType: "a date",
        mi.DictType: "a mapping",
    }.get(type(kind), "a value")


def _either(choices: Sequence[Any]) -> str:
    quoted = [repr(c) for c in choices]
    return " or ".join(quoted) if len(quoted) <= 2 else ", ".join(quoted[:-1]) + f" or {quoted[-1]}"


def _number(data: Any) -> bool:
    return isinstance(data, int | float) and not isinstance(data, bool)


# --------------------------------------------------------------------------- JSON types only


def mismatches(cls: type[msgspec.Struct], data: Any, where: str = "") -> Iterator[Mismatch]:
    """Each value in ``data`` at a field ``cls`` declares whose JSON type is not the declared
    one, as (where, value, what was expected); missing and undeclared fields are not looked at
    (a report written by other code: what a renderer reads must have dl-ci's type).

    A declaration's ``extra={"words": ...}`` names its type in messages ("text").
    """
    if isinstance(data, dict):
        for f in fields(cls):
            if f.name in data:
                here = f"{where}.{f.name}" if where else f.name
                yield from _mismatches(f.type, data[f.name], here, f.extra.get("words"))


def _mismatches(kind: mi.Type, data: Any, here: str, words: str | None) -> Iterator[Mismatch]:
    if isinstance(kind, mi.Metadata):
        yield from _mismatches(kind.type, data, here, (kind.extra or {}).get("words", words))
        return
    found = _member(kind, data)
    if found is None:
        yield here, data, words or json_words(kind)
    elif isinstance(found, mi.StructType):
        yield from mismatches(found.cls, data, here)
    elif isinstance(found, mi.ListType):
        for index, item in enumerate(data):
            yield from _mismatches(found.item_type, item, f"{here}[{index}]", None)
    elif isinstance(found, mi.DictType):
        for key, value in data.items():  # a key as long as the report is cut for the path
            yield from _mismatches(found.value_type, value, f"{here}.{_cut(str(key))}", None)


_JSON: dict[type[mi.Type], tuple[str, Callable[[Any], bool]]] = {
    mi.IntType: ("an integer", lambda v: isinstance(v, int) and not isinstance(v, bool)),
    mi.FloatType: ("a number", _number),
    mi.StrType: ("text", lambda v: isinstance(v, str)),
    mi.BoolType: ("true or false", lambda v: isinstance(v, bool)),
    mi.NoneType: ("null", lambda v: v is None),
    mi.AnyType: ("anything", lambda v: True),
    mi.ListType: ("a list", lambda v: isinstance(v, list)),
    mi.DictType: ("an object", lambda v: isinstance(v, dict)),
    mi.StructType: ("an object", lambda v: isinstance(v, dict)),
}


def _cut(key: str, width: int = 40) -> str:
    """A key of a document for a path in a message, at most ``width`` characters.

    >>> _cut("x" * 50)
    'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx...'
    """
    return key if len(key) <= width else key[: width - 3] + "..."


def _member(kind: mi.Type, data: Any) -> mi.Type | None:
    """The declared type (a member of a union) that ``data``'s JSON type is, or None."""
    if isinstance(kind, mi.Metadata):
        return _member(kind.type, data)
    if isinstance(kind, mi.UnionType):
        return next((m for t in kind.types if (m := _member(t, data)) is not None), None)
    if isinstance(kind, mi.LiteralType):  # the same JSON type and one of the values
        same = [v for v in kind.values if type(v) is type(data)]
        return kind if data in same else None
    _, fits = _JSON.get(type(kind), ("", lambda v: False))
    return kind if fits(data) else None


def json_words(kind: mi.Type) -> str:
    """A declared type in JSON's words.

    >>> json_words(mi.UnionType((mi.FloatType(), mi.NoneType())))
    'a number or null'
    """
    if isinstance(kind, mi.Metadata):
        return str((kind.extra or {}).get("words") or json_words(kind.type))
    if isinstance(kind, mi.UnionType):
        return " or ".join(dict.fromkeys(json_words(t) for t in kind.types))
    if isinstance(kind, mi.LiteralType):
        return _either(kind.values)
    return _JSON.get(type(kind), ("a value", None))[0]


# --------------------------------------------------------------------------- words for messages


def finite(number: float) -> bool:
    """Whether a number is finite as a float: an integer beyond 1.8e308 is not.

    >>> finite(1.0), finite(float("nan")), finite(10**400)
    (True, False, False)
    """
    try:
        return math.isfinite(number)
    except OverflowError:
        return False


def kind_of(data: Any) -> str:
    """The kind of a decoded value, in words.

    >>> kind_of(None), kind_of(True), kind_of([1])
    ('empty', 'a boolean', 'a list')
    """
    if data is None:
        return "empty"
    return {
        bool: "a boolean",
        int: "an integer",
        float: "a number",
        str: "a text",
        list: "a list",
        dict: "a mapping",
    }.get(type(data), type(data).__name__)


def show(data: Any) -> str:
    """A value for a message, cut to 40 characters."""
    text = repr(data)
    return text if len(text) <= 40 else text[:37] + "..."


def num(number: float) -> str:
    """A number for a message; an integer too long to read is given by its digits.

    >>> num(3.0), num(0.5), num(-(10**40))
    ('3', '0.5', 'a 41-digit negative integer')
    """
    if isinstance(number, int) and not isinstance(number, bool):
        if abs(number) >= 10**20:
            sign = " negative" if number < 0 else ""
            return f"a {len(str(abs(number)))}-digit{sign} integer"
        return str(number)
    whole = not isinstance(number, bool) and math.isfinite(number) and float(number).is_integer()
    return str(int(number)) if whole and abs(number) < 1e20 else str(number)


def closest(word: str, choices: Mapping[str, Any] | Sequence[str]) -> str | None:
    """The choice nearest to a misspelt ``word``, or None.

    >>> closest("nighty", ["pr", "merge", "nightly"])
    'nightly'
    """
    import difflib  # only once a key is wrong: a good document never needs it

    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.5)
    return close[0] if close else None


def suggest(
    word: str, choices: Mapping[str, Any] | Sequence[str], what: str, *, near: bool = True
) -> str:
    """A hint naming the nearest choice (unless not ``near``), then the choices (the first 20
    of a long list)."""
    close = closest(word, choices) if near else None
    names = list(choices)
    more = f" and {len(names) - 20} more" if len(names) > 20 else ""
    listing = f"{what}: {', '.join(names[:20])}{more}"
    return f"did you mean '{close}'? {listing}" if close else listing
