"""The ladder file format: declared classes that drive validation, the JSON schema and docs."""

from __future__ import annotations

from typing import Annotated, Any, Literal, get_args

import msgspec
from msgspec import UNSET, UnsetType

from dlci import jsonio, schema
from dlci.schema import meta

FORMAT_DOC = "docs/budget-ladder.md"
NAME_PATTERN = "^[a-z0-9][a-z0-9_.-]*$"
REQUIRED_BUDGETS = ("pr", "merge", "nightly")
INT_MAX = 2**63 - 1  # every count is a 64-bit integer in the reports and to torch
TIME_CAP_MAX = 7 * 24 * 60  # minutes: a week, past any CI job's limit (timers need a bound)
SCHEMA_ID = "https://github.com/org/dl-ci/blob/v1/budgets/ladder.schema.json"


class TierFields(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """One row of a budget: what the memorization test may spend on one hardware class."""

    max_epochs: Annotated[
        int,
        meta(
            "Epochs the memorization test may run; one epoch is one pass over the memorized batch.",
            "use a whole number of epochs such as 100",
            ge=1,
            le=INT_MAX,
        ),
    ]
    max_loss: (
        Annotated[
            float,
            meta(
                "An absolute training loss the memorization test must get below to pass "
                "(optional from version 2; a row states max_loss, max_relative_loss or both).",
                "use a positive loss such as 1.0, or state max_relative_loss instead",
                gt=0,
            ),
        ]
        | UnsetType
    ) = UNSET
    max_relative_loss: (
        Annotated[
            float,
            meta(
                "The share of its starting loss (measured on the batch before the first "
                "update, above the loss's floor) the loss must fall to; version 2. At most "
                "0.5: every pass needs the loss to have at least halved.",
                "use a share such as 0.1 (PR) or 0.01 (nightly)",
                gt=0,
                le=0.5,
            ),
        ]
        | UnsetType
    ) = UNSET
    time_cap_minutes: Annotated[
        float,
        meta(
            "Wall-clock limit of the memorization test, in minutes.",
            "use a positive number of minutes such as 5",
            gt=0,
            le=TIME_CAP_MAX,
        ),
    ]
    profile_steps: Annotated[
        int,
        meta(
            "Training steps recorded by the profiling step.",
            "use a whole number of steps such as 5",
            ge=1,
            le=INT_MAX,
        ),
    ]
    nproc: Annotated[
        int,
        meta(
            "Processes (one per GPU) the memorization test runs under torchrun; 1 means no DDP.",
            "use 1, or the number of GPUs on the runner",
            ge=1,
            le=INT_MAX,
        ),
    ]
    batch_size: Annotated[
        int,
        meta("Examples in the memorized batch.", "use a small batch such as 16", ge=1, le=INT_MAX),
    ] = 16


class ClassFields(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A hardware class: which GPUs it stands for and how fast they train."""

    match: Annotated[
        list[str],
        meta(
            "Case-insensitive regular expressions tried against the GPU name; the longest "
            "match wins.",
            "write a list of regular expressions, such as ['\\bA100']",
        ),
    ]
    speed: Annotated[
        float,
        meta(
            "Relative training throughput (T4 = 1.0); picks the nearest class for unnamed GPUs.",
            "use a positive number, such as 4.0 for an A100",
            gt=0,
        ),
    ]
    fallback: (
        Annotated[
            str,
            meta(
                "The class whose tiers this class uses in a budget that has no row for it.",
                "name another class declared under 'classes'",
            ),
        ]
        | UnsetType
    ) = UNSET
    description: Annotated[
        str, meta("What hardware the class stands for.", "write a short text")
    ] = ""


TIER_FIELDS = schema.fields(TierFields)
CLASS_FIELDS = schema.fields(ClassFields)

Version = Literal[1, 2]  # 1: max_loss only; 2: max_relative_loss too (docs/budget-ladder.md)
SUPPORTED_VERSIONS: tuple[int, ...] = get_args(Version)
CURRENT_VERSION = 2
THRESHOLD_KEYS = ("max_loss", "max_relative_loss")
Name = Annotated[str, msgspec.Meta(pattern=NAME_PATTERN)]


class LadderFile(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Per budget and hardware class, what the memorization test may spend."""

    version: Annotated[
        Version, meta("The ladder format version; this dl-ci reads versions 1 and 2.")
    ]
    revision: Annotated[
        str | float, meta("Free text naming this set of numbers, shown in every report.")
    ] = ""
    extends: (
        Annotated[
            str,
            meta(
                "'default' (dl-ci's own ladder) or a path, relative to this file, to extend.",
                min_length=1,
            ),
        ]
        | UnsetType
    ) = UNSET
    classes: Annotated[dict[Name, ClassFields], meta("Hardware classes by name.")]
    budgets: Annotated[
        dict[Name, dict[Name, TierFields | None]],
        meta("Budgets by name (pr, merge, nightly, ...), each a mapping of class to tier."),
    ]


TOP_KEYS = {f.name: f.description for f in schema.fields(LadderFile)}


# the words of messages live in dlci.schema; their old names here keep working
kind, show, num, closest, suggest = (
    schema.kind_of,
    schema.show,
    schema.num,
    schema.closest,
    schema.suggest,
)


def json_schema(*, complete: bool = True) -> dict[str, Any]:
    """The JSON schema of a ladder file, for editors and check-jsonschema, from LadderFile.

    ``complete=False`` gives the schema of a file that ``extends`` another: every key of a
    tier or class may then be left out, since the extended file supplies it.

    >>> json_schema()["properties"]["version"]["enum"]
    [1, 2]
    """
    _, defs = msgspec.json.schema_components([LadderFile])
    top = defs.pop("LadderFile")
    tier, cls = defs["TierFields"], defs["ClassFields"]
    tier["title"], cls["title"] = "tier", "hardware class"
    if complete:  # a complete row states at least one threshold, a ladder the three budgets
        tier["anyOf"] = [{"required": [key]} for key in THRESHOLD_KEYS]
        top["properties"]["budgets"]["required"] = list(REQUIRED_BUDGETS)
    else:
        tier["required"] = cls["required"] = []
        top["required"] = ["version"]
    del top["title"], top["description"]  # stated below, with the docs
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": SCHEMA_ID,
        "title": "dl-ci budget ladder, versions 1 and 2",
        "description": f"{LadderFile.__doc__} See {FORMAT_DOC}.",
        **top,
        "$defs": defs,
    }


SCHEMA_FILES = {"ladder.schema.json": True, "ladder-extends.schema.json": False}


def render_schema(complete: bool) -> str:
    """The schema file's exact text (sorted keys are not used: the order reads like the docs)."""
    return jsonio.encode(json_schema(complete=complete)).decode()


if __name__ == "__main__":  # python -m dlci.ladder.format DIR: regenerate the schema files
    import sys
    from pathlib import Path

    out = Path(sys.argv[1] if len(sys.argv) > 1 else "src/dlci/data")
    for filename, complete in SCHEMA_FILES.items():
        (out / filename).write_text(render_schema(complete), encoding="utf-8")
        print(f"wrote {out / filename}")
