"""The configuration's keys, declared once (ConfigTable): parsing, the JSON schema, the docs.

Every key is spelled as the action's input of the same name (kebab-case). A key is set, in
order of precedence, on the command line, as an action input (``DLCI_INPUT_<KEY>``), in the
environment (``DLCI_<KEY>``), in the configuration file, or by its default (docs/configuration.md).
"""

from __future__ import annotations

import json
import math
import shlex
from dataclasses import dataclass
from typing import Annotated, Any

import msgspec
import msgspec.inspect as mi
from msgspec import UNSET, UnsetType

from dlci import schema
from dlci.errors import DlciError
from dlci.policy import CHECK_IDS, THRESHOLDS, CheckTable, check_table
from dlci.schema import meta

CONFIG_DOC = "docs/configuration.md"
SCHEMA_FILE = "config.schema.json"
SCHEMA_ID = "https://github.com/org/dl-ci/blob/v1/src/dlci/data/config.schema.json"
TRUST = " Trusted: on a pull request, read from the base commit."
KINDS = {
    "text": "a text",
    "path": "a path",
    "paths": "a list of paths (a text: one path)",
    "args": "a list of arguments (a text: shell-quoted)",
    "number": "a number",
}


@dataclass(frozen=True)
class Key:
    """One key of the configuration: its type, range, trust, names and meaning."""

    name: str  # kebab-case, as the action's input
    kind: str  # one of KINDS
    meaning: str  # one line for docs/configuration.md and ``dlci config``
    hint: str  # what to write instead of a bad value
    trusted: bool = False  # on a pull request: read from the base commit (docs/configuration.md)
    minimum: float | None = None  # inclusive
    maximum: float | None = None  # inclusive
    default: Any = None  # None: unset (no gate, dl-ci's own choice)

    @property
    def env(self) -> str:
        """The environment layer's variable: ``DLCI_MIN_GPU_UTIL``."""
        return "DLCI_" + self.name.upper().replace("-", "_")

    @property
    def input_env(self) -> str:
        """The variable the action passes its input of the same name in."""
        return "DLCI_INPUT_" + self.name.upper().replace("-", "_")

    def range_text(self) -> str:
        """The allowed range in words.

        >>> KEYS["min-gpu-util"].range_text(), KEYS["max-utilization-drop"].range_text()
        ('from 0 to 100', '0 or more')
        """
        low, high = self.minimum, self.maximum
        if low is not None and high is not None:
            return f"from {low:g} to {high:g}"
        if low is not None:
            return f"{low:g} or more"
        return "any"

    def parse(self, value: Any, where: str) -> Any:
        """``value`` (from TOML, JSON or the command line) checked and normalised.

        ``where`` names the place in messages (``DLCI_INPUT_MIN_GPU_UTIL``, ``--min-gpu-util``);
        the file's own errors are located by the caller from the ValueError this raises.
        """
        try:
            return self.check(value)
        except ValueError as exc:
            raise DlciError(f"{where}: {self.name}: {exc}", hint=self.hint) from None

    def check(self, value: Any) -> Any:
        """``value`` normalised, or ValueError saying what was expected.

        >>> KEYS["tests"].check("tests/unit"), KEYS["pytest-args"].check("-k 'a or b'")
        (['tests/unit'], ['-k', 'a or b'])
        """
        if self.kind == "number":
            return self._number(value)
        if self.kind in ("text", "path"):
            if not isinstance(value, str) or not value.strip():
                raise ValueError(f"expected {KINDS[self.kind]}, got {_show(value)}")
            return value.strip()
        if isinstance(value, str):
            try:
                return [value] if self.kind == "paths" else shlex.split(value)
            except ValueError as exc:
                raise ValueError(f"cannot be split as a shell would ({exc})") from None
        if isinstance(value, list | tuple) and all(isinstance(v, str) for v in value):
            return list(value)
        raise ValueError(f"expected {KINDS[self.kind]}, got {_show(value)}")

    def from_text(self, text: str) -> Any:
        """A value given as text (an environment variable, an action input): lists are
        shell-quoted, numbers parsed."""
        if self.kind == "number":
            try:
                return self._number(float(text.strip()))
            except ValueError:
                raise ValueError(
                    f"expected a number {self.range_text()}, got {text!r:.60}"
                ) from None
        if self.kind == "paths":
            return self.check(_split(text))
        return self.check(text)

    def _number(self, value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"expected a number {self.range_text()}, got {_show(value)}")
        try:
            number = float(value)
        except OverflowError:  # an integer beyond any float: out of every range
            number = math.inf
        too_low = self.minimum is not None and number < self.minimum
        too_high = self.maximum is not None and number > self.maximum
        if not math.isfinite(number) or too_low or too_high:
            raise ValueError(f"must be {self.range_text()}, got {_show(value)}")
        return number


def _split(text: str) -> list[str]:
    try:
        return shlex.split(text)
    except ValueError as exc:
        raise ValueError(f"cannot be split as a shell would ({exc})") from None


def _show(value: Any) -> str:
    return f"{schema.show(value)} ({schema.kind_of(value)})" if value is not None else "nothing"


class ConfigTable(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, rename="kebab"):
    """The dl-ci table of a configuration file: each key's kind (``kind``: one of KINDS),
    trust, range and meaning, declared once."""

    target: (
        Annotated[
            str,
            meta(
                "The function that returns the project's dlci.Target, as package.module:function, "
                "or the training command for script mode (python train.py ...).",
                "write target = 'package.module:function'",
                min_length=1,
                kind="text",
            ),
        ]
        | UnsetType
    ) = UNSET
    ladder: (
        Annotated[
            str,
            meta(
                "The budget ladder file, relative to the configuration file's folder "
                "(default: dl-ci's own).",
                "write the path of a ladder file, such as ladder = 'ci/ladder.yaml'",
                min_length=1,
                kind="path",
                trusted=True,  # which ladder judges a pull request is the base's choice
            ),
        ]
        | UnsetType
    ) = UNSET
    tests: (
        Annotated[
            str | list[str],
            meta(
                "Test paths for pytest (default: pytest's own discovery).",
                "write tests = ['tests'] (a list of paths)",
                kind="paths",
            ),
        ]
        | UnsetType
    ) = UNSET
    pytest_args: (
        Annotated[
            str | list[str],
            meta(
                "More pytest arguments, a list or one shell-quoted text.",
                "write pytest-args = ['-x', '-k', 'not slow']",
                kind="args",
            ),
        ]
        | UnsetType
    ) = UNSET
    min_gpu_util: (
        Annotated[
            float,
            meta(
                "The utilization gate: the profile fails under this GPU utilization, in percent.",
                "write a percentage such as min-gpu-util = 40",
                ge=0,
                le=100,
                kind="number",
                trusted=True,
            ),
        ]
        | UnsetType
    ) = UNSET
    max_gpu_memory: (
        Annotated[
            float,
            meta(
                "The memory gate: the profile fails over this peak share of the GPU's memory, "
                "in percent.",
                "write a percentage such as max-gpu-memory = 90",
                ge=0,
                le=100,
                kind="number",
                trusted=True,
            ),
        ]
        | UnsetType
    ) = UNSET
    max_utilization_drop: (
        Annotated[
            float,
            meta(
                "Fail when GPU utilization fell from the baseline by more than this many "
                "points, with 95% confidence.",
                "write a number of percentage points such as max-utilization-drop = 5",
                ge=0,
                kind="number",
                trusted=True,
            ),
        ]
        | UnsetType
    ) = UNSET
    max_step_time_regression: (
        Annotated[
            float,
            meta(
                "Fail when the step time grew from the baseline by more than this percentage, "
                "with 95% confidence.",
                "write a percentage such as max-step-time-regression = 10",
                ge=0,
                kind="number",
                trusted=True,
            ),
        ]
        | UnsetType
    ) = UNSET
    doctor: (
        Annotated[
            dict[str, Any],
            meta(
                "The doctor's checks: waivers and thresholds, by check ID.",
                "write [doctor.checks.<check-id>]",
            ),
        ]
        | UnsetType
    ) = UNSET


def _key(f: schema.Field) -> Key:
    bounds = f.type if isinstance(f.type, mi.FloatType) else None
    return Key(
        f.name,
        f.extra["kind"],
        f.description,
        f.hint,
        trusted=bool(f.extra.get("trusted")),
        minimum=bounds.ge if bounds else None,
        maximum=bounds.le if bounds else None,
    )


KEYS: dict[str, Key] = {f.name: _key(f) for f in schema.fields(ConfigTable) if "kind" in f.extra}
TRUSTED = tuple(k.name for k in KEYS.values() if k.trusted)
WAIVER_KEYS: dict[str, str] = {f.name: f.description for f in schema.fields(CheckTable)}


# --------------------------------------------------------------------------- schema and docs


def json_schema() -> dict[str, Any]:
    """The JSON schema of the configuration (dlci.toml, or ``[tool.dlci]``), for editors."""

    table = schema.json_schema(ConfigTable)
    for name, key in KEYS.items():
        if key.trusted:
            table["properties"][name]["description"] += TRUST
    checks = {
        check: {
            **schema.json_schema(check_table(check)),
            "dependentRequired": {"waive": ["reason"], "reason": ["waive"], "until": ["waive"]},
        }
        for check in CHECK_IDS
    }
    for body in checks.values():
        body.pop("required", None)  # every key of a check's table may be left out
    table["properties"]["doctor"] = {
        "description": table["properties"]["doctor"]["description"],
        "type": "object",
        "properties": {
            "checks": {"type": "object", "properties": checks, "additionalProperties": False}
        },
        "additionalProperties": False,
    }
    table.pop("required", None)
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": SCHEMA_ID,
        "title": "dl-ci configuration (dlci.toml, or [tool.dlci] in pyproject.toml)",
        "description": f"See {CONFIG_DOC}.",
        **table,
    }


def render_schema() -> str:
    """The schema file's text, as committed in src/dlci/data/ (``dlci config --schema``)."""
    return json.dumps(json_schema(), indent=2, sort_keys=False) + "\n"


def key_table() -> str:
    """The Markdown table of every key, as docs/configuration.md holds it."""
    rows = [
        "| key | type | default | range | trusted | environment | action input | meaning |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for key in KEYS.values():
        rng = key.range_text() if key.kind == "number" else "-"
        default = "unset" if key.default is None else key.default
        rows.append(
            f"| `{key.name}` | {KINDS[key.kind]} | {default} | {rng} "
            f"| {'yes' if key.trusted else 'no'} | `{key.env}` | `{key.name}` | {key.meaning} |"
        )
    return "\n".join(rows) + "\n"


def threshold_rows() -> str:
    """The Markdown table of every threshold (dlci.policy.THRESHOLDS)."""
    rows = ["| check | key | default | range | meaning |", "|---|---|---|---|---|"]
    for t in THRESHOLDS:
        rows.append(
            f"| `{t.check}` | `{t.key}` | {t.default:g} | {t.low:g} to {t.high:g} | {t.meaning} |"
        )
    return "\n".join(rows) + "\n"
