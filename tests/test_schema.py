"""The declared schema layer: each constraint can fail, and every problem of a document is
reported at once, each at its key path."""

from __future__ import annotations

import json
from typing import Annotated, Literal

import jsonschema
import msgspec
import pytest

from dlci import schema
from dlci.errors import DlciError
from dlci.schema import Problem, Problems, meta


class Shape(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A shape that uses every kind of constraint the layer knows."""

    count: Annotated[int, meta("How many.", "use 1 to 10", ge=1, le=10)]
    share: Annotated[float, meta("A share.", "use a share such as 0.5", gt=0, le=1)] = 0.5
    name: Annotated[str, meta("A name.", "write a name")] = ""
    tags: Annotated[list[str], meta("Tags.", "write a list of texts")] = []
    mode: Annotated[Literal["skip", "warn-only"], meta("A mode.", "skip or warn-only")] = "skip"
    on: Annotated[bool, meta("A switch.", "true or false")] = False
    limit: Annotated[float, meta("A limit.", "a number or nothing", lt=100)] | None = None


GOOD = {"count": 3}


def one(**changes: object) -> list[tuple[str, str]]:
    _, found = schema.check(Shape, {**GOOD, **changes}, ("top",))
    return [(schema_path(p), p.message) for p in found]


def schema_path(p: Problem) -> str:
    return ".".join(str(part) for part in p.path)


def test_a_good_document_has_no_problem_and_gets_its_defaults() -> None:
    values, found = schema.check(Shape, {"count": 3.0, "share": 1})
    assert found == []
    assert values == {
        "count": 3,
        "share": 1.0,
        "name": "",
        "tags": [],
        "mode": "skip",
        "on": False,
        "limit": None,
    }
    assert type(values["count"]) is int and type(values["share"]) is float


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"count": 0}, "must be at least 1, got 0"),
        ({"count": 11}, "must be at most 10, got 11"),
        ({"share": 0}, "must be greater than 0, got 0"),
        ({"share": 2}, "must be at most 1, got 2"),
        ({"limit": 100}, "must be less than 100, got 100"),
        ({"share": float("nan")}, "must be a finite number, got nan"),
        ({"share": 10**400}, "must be a finite number, got a 401-digit integer"),
        ({"count": 1.5}, "expected an integer, got 1.5 (a number)"),
        ({"count": True}, "expected an integer, got True (a boolean)"),
        ({"share": "0.5"}, "expected a number, got '0.5' (a text)"),
        ({"name": 5}, "expected a text, got 5 (an integer)"),
        ({"tags": ["a", 1]}, "expected a list of texts, got ['a', 1] (a list)"),
        ({"mode": "off"}, "must be 'skip' or 'warn-only', got 'off'"),
        ({"on": 1}, "expected true or false, got 1 (an integer)"),
        ({"limit": "x"}, "expected a number, got 'x' (a text)"),
    ],
    ids=lambda v: str(v)[:30],
)
def test_each_declared_constraint_can_fail(change: dict[str, object], message: str) -> None:
    (key,) = change
    assert one(**change) == [(f"top.{key}", message)]


def test_every_problem_of_a_document_is_reported_at_once_in_order() -> None:
    _, found = schema.check(Shape, {"cuont": 1, "share": 2, "tags": "a"}, ("top",))
    assert found == [
        Problem(("top", "cuont"), "unknown key", "did you mean 'count'? known keys: "
                "count, share, name, tags, mode, on, limit"),
        Problem(("top", "share"), "must be at most 1, got 2", "use a share such as 0.5"),
        Problem(("top", "tags"), "expected a list of texts, got 'a' (a text)",
                "write a list of texts"),
    ]  # fmt: skip


def test_a_missing_key_is_reported_unless_it_is_misspelt() -> None:
    _, found = schema.check(Shape, {"name": "x"})
    assert found == [Problem((), "missing required key 'count'", "count: use 1 to 10")]
    _, found = schema.check(Shape, {"cuont": 1})
    assert [p.message for p in found] == ["unknown key"]  # the hint says "did you mean"


def test_one_error_is_raised_alone_and_several_together() -> None:
    first = DlciError("a: bad", file="f.yaml", line=3, hint="fix a")
    second = DlciError("b: worse", file="f.yaml", line=9)
    schema.raise_all([])
    with pytest.raises(DlciError) as info:
        schema.raise_all([first])
    assert info.value is first
    with pytest.raises(Problems) as many:
        schema.raise_all([first, second])
    assert str(many.value) == "f.yaml:3: a: bad\n  hint: fix a\nf.yaml:9: b: worse"
    assert (many.value.file, many.value.line, many.value.message) == ("f.yaml", 3, "a: bad")


def test_a_long_list_of_problems_is_cut() -> None:
    errors = [DlciError(f"k{i}: bad", file="f", line=i + 1) for i in range(schema.SHOWN + 5)]
    text = str(Problems(errors)).splitlines()
    assert len(text) == schema.SHOWN + 1
    assert text[-1] == "and 5 more problems"


def test_the_json_schema_comes_from_the_same_declarations() -> None:
    generated = schema.json_schema(Shape)
    jsonschema.Draft202012Validator.check_schema(generated)
    assert generated["properties"]["count"] == {
        "description": "How many.",
        "type": "integer",
        "minimum": 1,
        "maximum": 10,
    }
    assert generated["required"] == ["count"]
    assert generated["additionalProperties"] is False
    assert "hint" not in json.dumps(generated)  # the hint is for messages, not the schema


def test_the_walker_and_the_json_schema_agree_on_each_case() -> None:
    validator = jsonschema.Draft202012Validator(schema.json_schema(Shape))
    for change in ({"count": 0}, {"share": 2}, {"mode": "off"}, {"x": 1}, {"count": 2}):
        doc = {**GOOD, **change}
        assert (schema.check(Shape, doc)[1] == []) == validator.is_valid(doc), doc


class Report(msgspec.Struct):
    """A report's shape: what a renderer reads, by JSON type only."""

    count: int
    share: float | None
    rows: list[Shape]
    pct: dict[str, float]


def test_a_json_type_that_is_not_the_declared_one_is_found_at_its_path() -> None:
    good = {"count": 1, "share": None, "rows": [{"name": "x", "undeclared": [1]}], "pct": {}}
    assert list(schema.mismatches(Report, good)) == []
    bad = {"count": 1.0, "share": "x", "rows": [{"share": [1]}], "pct": {"a": True}, "more": 1}
    assert list(schema.mismatches(Report, bad)) == [
        ("count", 1.0, "an integer"),
        ("share", "x", "a number or null"),
        ("rows[0].share", [1], "a number"),
        ("pct.a", True, "a number"),
    ]
    assert list(schema.mismatches(Report, {"rows": {}})) == [("rows", {}, "a list")]
