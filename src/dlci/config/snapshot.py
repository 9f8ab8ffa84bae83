"""A configuration snapshot (``Config.to_json()``) read back and checked, key by key.

The host writes the snapshot into the preflight's report; the containers read it back. It
crosses a boundary, so every part is checked as the file's keys are: a bad one is one
DlciError naming the key, never a traceback.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from dlci.config.keys import KEYS
from dlci.errors import DlciError
from dlci.policy import CHECK_IDS, WAIVER_MODES, Policy, Waiver, threshold_table

Parts = tuple[dict[str, Any], dict[str, str], Policy, list[str], str | None]


def check_snapshot(data: Any, where: str) -> Parts:
    """(values, sources, policy, notes, file) of a snapshot; DlciError naming a bad key."""

    def bad(path: str, problem: str) -> DlciError:
        return DlciError(
            f"{where}: {path}: {problem}",
            hint="the snapshot is written by dlci preflight; run the same dl-ci version on the "
            "host and in the container",
        )

    if not isinstance(data, dict):
        raise bad("(top)", "expected a mapping")
    if data.get("schema_version") != 1 or data.get("kind") != "config":
        raise bad("schema_version", "expected a configuration snapshot of schema_version 1")
    raw_values, raw_sources = data.get("values"), data.get("sources")
    if not isinstance(raw_values, dict) or not isinstance(raw_sources, dict):
        raise bad("values", "expected mappings 'values' and 'sources'")
    values: dict[str, Any] = {}
    for name, value in raw_values.items():
        if name not in KEYS:
            raise bad(f"values.{str(name)[:60]}", "unknown key")
        try:
            values[name] = None if value is None else KEYS[name].check(value)
        except ValueError as exc:
            raise bad(f"values.{name}", str(exc)) from None
    sources = {str(k): v for k, v in raw_sources.items() if k in KEYS}
    if not all(isinstance(v, str) for v in sources.values()):
        raise bad("sources", "expected texts")
    notes, file = data.get("notes") or [], data.get("file")
    if not isinstance(notes, list) or not all(isinstance(n, str) for n in notes):
        raise bad("notes", "expected a list of texts")
    if file is not None and not isinstance(file, str):
        raise bad("file", "expected a text or null")
    return values, sources, _policy(data.get("policy"), bad), notes, file


def _policy(data: Any, bad: Any) -> Policy:

    if data is None:
        return Policy(origin="default")
    if not isinstance(data, dict):
        raise bad("policy", "expected a mapping")
    waivers = data.get("waivers") or []
    if not isinstance(waivers, list):
        raise bad("policy.waivers", "expected a list")
    for index, w in enumerate(waivers):
        ok = (
            isinstance(w, dict)
            and w.get("check") in CHECK_IDS
            and w.get("mode") in WAIVER_MODES
            and isinstance(w.get("reason"), str)
            and bool(w["reason"].strip())
            and isinstance(w.get("source", ""), str)
            and _date_or_none(w.get("until"))
        )
        if not ok:
            raise bad(f"policy.waivers[{index}]", "expected check, mode, reason, until, source")
    thresholds = data.get("thresholds") or {}
    table = threshold_table()
    if not isinstance(thresholds, dict):
        raise bad("policy.thresholds", "expected a mapping")
    for name, value in thresholds.items():
        spec = table.get(name)
        if spec is None:
            raise bad(f"policy.thresholds.{str(name)[:60]}", "unknown threshold")
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        if not ok or not spec.low <= value <= spec.high:  # False for nan; no float() overflow
            raise bad(
                f"policy.thresholds.{name}", f"expected a number from {spec.low:g} to {spec.high:g}"
            )
    return Policy(
        waivers=tuple(Waiver.from_json(w) for w in waivers),
        thresholds={str(k): float(v) for k, v in thresholds.items()},
        origin=str(data.get("origin") or ""),
    )


def _date_or_none(value: Any) -> bool:
    if value is None:
        return True
    try:
        dt.date.fromisoformat(value)
    except (TypeError, ValueError):
        return False
    return True
