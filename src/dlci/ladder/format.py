"""The ladder file format: one table of keys that drives validation, the JSON schema and docs."""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dlci.ladder.yamlsource import KeyPath, YamlSource, dotted

FORMAT_DOC = "docs/budget-ladder.md"
NAME_PATTERN = "^[a-z0-9][a-z0-9_.-]*$"
REQUIRED_BUDGETS = ("pr", "merge", "nightly")
INT_MAX = 2**63 - 1  # every count is a 64-bit integer in the reports and to torch
TIME_CAP_MAX = 7 * 24 * 60  # minutes: a week, past any CI job's limit (timers need a bound)
SCHEMA_ID = "https://github.com/org/dl-ci/blob/v1/budgets/ladder.schema.json"


@dataclass(frozen=True)
class FieldSpec:
    """One key of the ladder format: its type, bounds, meaning and a fix-it hint.

    The same table drives validation, the JSON schema and the docs, so they cannot drift.
    """

    name: str
    kind: str  # "int", "number", "string", "patterns"
    description: str
    hint: str
    required: bool = True
    minimum: float | None = None  # inclusive
    exclusive_minimum: float | None = None
    maximum: float | None = None  # inclusive
    default: Any = None


TIER_FIELDS: tuple[FieldSpec, ...] = (
    FieldSpec(
        "max_epochs",
        "int",
        "Epochs the memorization test may run; one epoch is one pass over the memorized batch.",
        "use a whole number of epochs such as 100",
        minimum=1,
        maximum=INT_MAX,
    ),
    FieldSpec(
        "max_loss",
        "number",
        "An absolute training loss the memorization test must get below to pass (optional "
        "from version 2; a row states max_loss, max_relative_loss or both).",
        "use a positive loss such as 1.0, or state max_relative_loss instead",
        required=False,
        exclusive_minimum=0,
    ),
    FieldSpec(
        "max_relative_loss",
        "number",
        "The share of its starting loss (measured on the batch before the first update, above "
        "the loss's floor) the loss must fall to; version 2. At most 0.5: every pass needs the "
        "loss to have at least halved.",
        "use a share such as 0.1 (PR) or 0.01 (nightly)",
        required=False,
        exclusive_minimum=0,
        maximum=0.5,
    ),
    FieldSpec(
        "time_cap_minutes",
        "number",
        "Wall-clock limit of the memorization test, in minutes.",
        "use a positive number of minutes such as 5",
        exclusive_minimum=0,
        maximum=TIME_CAP_MAX,
    ),
    FieldSpec(
        "profile_steps",
        "int",
        "Training steps recorded by the profiling step.",
        "use a whole number of steps such as 5",
        minimum=1,
        maximum=INT_MAX,
    ),
    FieldSpec(
        "nproc",
        "int",
        "Processes (one per GPU) the memorization test runs under torchrun; 1 means no DDP.",
        "use 1, or the number of GPUs on the runner",
        minimum=1,
        maximum=INT_MAX,
    ),
    FieldSpec(
        "batch_size",
        "int",
        "Examples in the memorized batch.",
        "use a small batch such as 16",
        required=False,
        minimum=1,
        maximum=INT_MAX,
        default=16,
    ),
)

CLASS_FIELDS: tuple[FieldSpec, ...] = (
    FieldSpec(
        "match",
        "patterns",
        "Case-insensitive regular expressions tried against the GPU name; the longest match wins.",
        "write a list of regular expressions, such as ['\\bA100']",
    ),
    FieldSpec(
        "speed",
        "number",
        "Relative training throughput (T4 = 1.0); picks the nearest class for unnamed GPUs.",
        "use a positive number, such as 4.0 for an A100",
        exclusive_minimum=0,
    ),
    FieldSpec(
        "fallback",
        "string",
        "The class whose tiers this class uses in a budget that has no row for it.",
        "name another class declared under 'classes'",
        required=False,
    ),
    FieldSpec(
        "description",
        "string",
        "What hardware the class stands for.",
        "write a short text",
        required=False,
        default="",
    ),
)

SUPPORTED_VERSIONS = (1, 2)  # 1: max_loss only; 2: max_relative_loss too (docs/budget-ladder.md)
CURRENT_VERSION = 2
THRESHOLD_KEYS = ("max_loss", "max_relative_loss")

TOP_KEYS: dict[str, str] = {
    "version": "The ladder format version; this dl-ci reads versions 1 and 2.",
    "revision": "Free text naming this set of numbers, shown in every report.",
    "extends": "'default' (dl-ci's own ladder) or a path, relative to this file, to extend.",
    "classes": "Hardware classes by name.",
    "budgets": "Budgets by name (pr, merge, nightly, ...), each a mapping of class to tier.",
}


def check_value(source: YamlSource, path: KeyPath, value: Any, spec: FieldSpec) -> Any:
    expected = {
        "int": "an integer",
        "number": "a number",
        "string": "a text",
        "patterns": "a list of texts",
    }[spec.kind]
    ok = {
        # as in JSON Schema, 100.0 is an integer
        "int": (isinstance(value, int) and not isinstance(value, bool))
        or (isinstance(value, float) and value.is_integer()),
        "number": isinstance(value, int | float) and not isinstance(value, bool),
        "string": isinstance(value, str),
        "patterns": isinstance(value, list) and all(isinstance(p, str) for p in value),
    }[spec.kind]
    if not ok:
        raise source.error(
            path, f"expected {expected}, got {show(value)} ({kind(value)})", hint=spec.hint
        )
    if spec.kind == "number" and not _finite(value):
        raise source.error(path, f"must be a finite number, got {num(value)}", hint=spec.hint)
    if spec.minimum is not None and value < spec.minimum:
        raise source.error(
            path, f"must be at least {num(spec.minimum)}, got {num(value)}", hint=spec.hint
        )
    if spec.exclusive_minimum is not None and value <= spec.exclusive_minimum:
        raise source.error(
            path,
            f"must be greater than {num(spec.exclusive_minimum)}, got {num(value)}",
            hint=spec.hint,
        )
    if spec.maximum is not None and value > spec.maximum:
        raise source.error(
            path, f"must be at most {num(spec.maximum)}, got {num(value)}", hint=spec.hint
        )
    return value


def _finite(value: float) -> bool:
    """Whether a number is finite as a float: an integer beyond 1.8e308 is not.

    >>> _finite(1.0), _finite(float("nan")), _finite(10**400)
    (True, False, False)
    """
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def check_keys(
    source: YamlSource,
    path: KeyPath,
    raw: dict[str, Any],
    known: Mapping[str, str],
    required: tuple[str, ...],
) -> None:
    for key in raw:
        if key not in known:
            raise source.error(
                (*path, str(key)), "unknown key", hint=suggest(str(key), known, "known keys")
            )
    for key in required:
        if key not in raw:
            raise source.error(path, f"missing required key '{key}'", hint=known[key])


def check_name(source: YamlSource, path: KeyPath, name: Any) -> None:
    if not isinstance(name, str) or not re.fullmatch(NAME_PATTERN, name):
        raise source.error(
            path,
            f"invalid name {show(name)}",
            hint="use lower-case letters, digits, '-', '_' or '.', such as 'a100' or 'rtx-4090'",
        )


def mapping(source: YamlSource, path: KeyPath, value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise source.error(
            path,
            f"expected a mapping, got {show(value)} ({kind(value)})",
            hint=f"see {FORMAT_DOC} for the layout of '{dotted(path[:1])}'",
        )
    return value


def closest(word: str, choices: Mapping[str, Any] | list[str]) -> str | None:
    """The choice nearest to a misspelt ``word``, or None.

    >>> closest("nighty", ["pr", "merge", "nightly"])
    'nightly'
    """
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.5)
    return close[0] if close else None


def suggest(word: str, choices: Mapping[str, Any] | list[str], what: str) -> str:
    """A hint naming the nearest choice, then the choices (the first 20 of a long list)."""
    close = closest(word, choices)
    names = list(choices)
    more = f" and {len(names) - 20} more" if len(names) > 20 else ""
    listing = f"{what}: {', '.join(names[:20])}{more}"
    return f"did you mean '{close}'? {listing}" if close else listing


def kind(value: Any) -> str:
    if value is None:
        return "empty"
    return {
        bool: "a boolean",
        int: "an integer",
        float: "a number",
        str: "a text",
        list: "a list",
        dict: "a mapping",
    }.get(type(value), type(value).__name__)


def show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def num(value: float) -> str:
    """A number for a message; an integer too long to read is given by its digits.

    >>> num(3.0), num(0.5), num(-(10**40))
    ('3', '0.5', 'a 41-digit negative integer')
    """
    if isinstance(value, int) and not isinstance(value, bool):
        if abs(value) >= 10**20:
            sign = " negative" if value < 0 else ""
            return f"a {len(str(abs(value)))}-digit{sign} integer"
        return str(value)
    whole = not isinstance(value, bool) and math.isfinite(value) and float(value).is_integer()
    return str(int(value)) if whole and abs(value) < 1e20 else str(value)


_JSON_TYPES = {"int": "integer", "number": "number", "string": "string"}


def _field_schema(spec: FieldSpec) -> dict[str, Any]:
    if spec.kind == "patterns":
        schema: dict[str, Any] = {"type": "array", "items": {"type": "string"}}
    else:
        schema = {"type": _JSON_TYPES[spec.kind]}
    if spec.minimum is not None:
        schema["minimum"] = spec.minimum
    if spec.exclusive_minimum is not None:
        schema["exclusiveMinimum"] = spec.exclusive_minimum
    if spec.maximum is not None:
        schema["maximum"] = spec.maximum
    if spec.default is not None and spec.default != "":
        schema["default"] = spec.default
    schema["description"] = spec.description
    return schema


def _object(specs: tuple[FieldSpec, ...], title: str) -> dict[str, Any]:
    return {
        "type": "object",
        "title": title,
        "additionalProperties": False,
        "required": [spec.name for spec in specs if spec.required],
        "properties": {spec.name: _field_schema(spec) for spec in specs},
    }


def json_schema(*, complete: bool = True) -> dict[str, Any]:
    """The JSON schema of a ladder file, for editors and check-jsonschema.

    ``complete=False`` gives the schema of a file that ``extends`` another: every key of a
    tier or class may then be left out, since the extended file supplies it.

    >>> json_schema()["properties"]["version"]["enum"]
    [1, 2]
    """
    name = {"type": "string", "pattern": NAME_PATTERN}
    tier = _object(TIER_FIELDS, "tier")
    cls = _object(CLASS_FIELDS, "hardware class")
    if complete:  # a complete row states at least one threshold
        tier["anyOf"] = [{"required": [key]} for key in THRESHOLD_KEYS]
    else:
        tier["required"] = cls["required"] = []
    top: dict[str, dict[str, Any]] = {key: {"description": text} for key, text in TOP_KEYS.items()}
    top["version"].update({"enum": list(SUPPORTED_VERSIONS)})
    top["revision"].update({"type": ["string", "number"]})
    top["extends"].update({"type": "string", "minLength": 1})
    top["classes"].update(
        {"type": "object", "propertyNames": name, "additionalProperties": {"$ref": "#/$defs/class"}}
    )
    top["budgets"].update(
        {
            "type": "object",
            "propertyNames": name,
            "additionalProperties": {
                "type": "object",
                "propertyNames": name,
                "additionalProperties": {"oneOf": [{"$ref": "#/$defs/tier"}, {"type": "null"}]},
            },
        }
    )
    if complete:
        top["budgets"]["required"] = list(REQUIRED_BUDGETS)
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": SCHEMA_ID,
        "title": "dl-ci budget ladder, versions 1 and 2",
        "description": "Per budget and hardware class, what the memorization test may spend. "
        f"See {FORMAT_DOC}.",
        "type": "object",
        "additionalProperties": False,
        "required": ["version"] if not complete else ["version", "classes", "budgets"],
        "properties": top,
        "$defs": {"tier": tier, "class": cls},
    }


SCHEMA_FILES = {"ladder.schema.json": True, "ladder-extends.schema.json": False}


def render_schema(complete: bool) -> str:
    """The schema file's exact text (sorted keys are not used: the order reads like the docs)."""
    from dlci import jsonio

    return jsonio.encode(json_schema(complete=complete)).decode()


if __name__ == "__main__":  # python -m dlci.ladder.format DIR: regenerate the schema files
    import sys
    from pathlib import Path

    out = Path(sys.argv[1] if len(sys.argv) > 1 else "src/dlci/data")
    for filename, complete in SCHEMA_FILES.items():
        (out / filename).write_text(render_schema(complete), encoding="utf-8")
        print(f"wrote {out / filename}")
