"""A configuration file's dl-ci table checked key by key: its values and the doctor's policy.

Every mistake is one located DlciError: an unknown key (with the nearest known one), a value
of the wrong type or out of range (with the range), a waiver without a reason, an unknown
check ID, a threshold that check does not have, an ``until`` that is not a date.
"""

from __future__ import annotations

import datetime as dt
import os
import re
from collections.abc import Mapping
from typing import Any

from dlci.config.keys import CONFIG_DOC, KEYS, WAIVER_KEYS
from dlci.config.source import TomlSource
from dlci.policy import WAIVER_MODES, Policy, Waiver, threshold_table

Values = dict[str, tuple[Any, str]]  # key -> (value, where it was set)


def suggest(name: str, choices: Mapping[str, Any] | list[str], what: str) -> str:
    """dlci.ladder.format's hint, imported only when a key is wrong: it brings PyYAML and
    difflib, which a run with a good configuration (every ``dlci analyze``) does not need."""
    from dlci.ladder.format import suggest as ladder_suggest

    return ladder_suggest(name, choices, what)


def read_table(source: TomlSource, folder: str = "") -> tuple[Values, Policy]:
    """The keys a file sets (each with ``file:line``) and its policy (origin: the file).

    A relative ``ladder`` is resolved against ``folder``, the file's folder.
    """
    values: Values = {}
    policy = Policy(origin=source.display)
    for name, raw in source.data.items():
        if name == "doctor":
            policy = read_doctor(source, raw)
        elif name in KEYS:
            try:
                values[name] = (KEYS[name].check(raw), source.where((name,)))
            except ValueError as exc:
                raise source.error((name,), str(exc), hint=KEYS[name].hint) from None
        else:
            raise source.error((name,), "unknown key", hint=_did_you_mean(name))
    if "ladder" in values:
        path, where = values["ladder"]
        values["ladder"] = (path if os.path.isabs(path) else os.path.join(folder, path), where)
    return values, policy


def _did_you_mean(name: str) -> str:
    choices = [*KEYS, "doctor"]
    if name.replace("_", "-") in choices:
        return (
            f"did you mean '{name.replace('_', '-')}'? keys are kebab-case, as the action's inputs"
        )
    return suggest(name, choices, "keys") + f" (see {CONFIG_DOC})"


def read_doctor(source: TomlSource, raw: Any) -> Policy:
    """``[doctor.checks.<check-id>]`` tables: waivers and thresholds."""
    from dlci.checks import CHECK_IDS

    if not isinstance(raw, dict):
        raise source.error(("doctor",), "must be a table", hint="write [doctor.checks.<check-id>]")
    for key in raw:
        if key != "checks":
            raise source.error(
                ("doctor", key), "unknown key", hint="the doctor's table holds checks"
            )
    checks = raw.get("checks", {})
    if not isinstance(checks, dict):
        raise source.error(("doctor", "checks"), "must be a table of check IDs")
    waivers: list[Waiver] = []
    thresholds: dict[str, float] = {}
    for check, table in checks.items():
        path = ("doctor", "checks", check)
        if check not in CHECK_IDS:
            raise source.error(
                path, "unknown check", hint=suggest(check, list(CHECK_IDS), "checks")
            )
        if not isinstance(table, dict):
            raise source.error(
                path, "must be a table", hint="write waive, reason, until or thresholds"
            )
        waiver = _waiver(source, path, table)
        if waiver is not None:
            waivers.append(waiver)
        thresholds.update(_thresholds(source, path, table))
    return Policy(waivers=tuple(waivers), thresholds=thresholds, origin=source.display)


def _waiver(source: TomlSource, path: tuple[str, ...], table: dict[str, Any]) -> Waiver | None:
    mode, reason, until = table.get("waive"), table.get("reason"), table.get("until")
    if mode is None:
        for key in ("reason", "until"):
            if key in table:
                raise source.error((*path, key), "given without waive", hint=WAIVER_KEYS["waive"])
        return None
    if mode not in WAIVER_MODES:
        raise source.error((*path, "waive"), f"must be 'skip' or 'warn-only', got {mode!r:.60}")
    if not isinstance(reason, str) or not any(c.isalnum() for c in reason):  # not "\u200b"
        raise source.error(
            (*path, "reason" if "reason" in table else "waive"),
            "a waiver needs a reason (a non-empty text)",
            hint="say why the check is wrong for this model, e.g. reason = 'BatchNorm-free model'",
        )
    return Waiver(
        check=path[-1],
        mode=mode,
        reason=reason.strip(),
        until=_until(source, (*path, "until"), until),
        source=source.where((*path, "waive")),
    )


def _until(source: TomlSource, path: tuple[str, ...], value: Any) -> dt.date | None:
    if value is None:
        return None
    if isinstance(value, dt.date) and not isinstance(value, dt.datetime):
        return value
    if isinstance(value, str) and re.fullmatch(r"\d{4}-\d{2}-\d{2}", value.strip()):
        try:
            return dt.date.fromisoformat(value.strip())
        except ValueError:
            pass
    raise source.error(
        path, f"must be a date, got {value!r:.60}", hint="write until = 2027-01-31 (a TOML date)"
    )


def _thresholds(
    source: TomlSource, path: tuple[str, ...], table: dict[str, Any]
) -> dict[str, float]:
    known = {t.key: t for t in threshold_table().values() if t.check == path[-1]}
    found: dict[str, float] = {}
    for key, value in table.items():
        if key in WAIVER_KEYS:
            continue
        spec = known.get(key)
        if spec is None:
            names = ", ".join(known) or "none"
            raise source.error(
                (*path, key),
                "unknown key",
                hint=f"{path[-1]} takes waive, reason, until and its thresholds: {names}",
            )
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        if not ok or not spec.low <= value <= spec.high:  # exact: no float() of a huge integer
            raise source.error(
                (*path, key),
                f"must be a number from {spec.low:g} to {spec.high:g}, got {value!r:.60}",
                hint=f"{spec.meaning} (default {spec.default:g})",
            )
        found[spec.name] = float(value)
    _pairs_in_order(source, path, known, found)
    return found


def _pairs_in_order(
    source: TomlSource,
    path: tuple[str, ...],
    known: dict[str, Any],
    found: dict[str, float],
) -> None:
    """A warning's bound must lie on the passing side of its failure's (warn-rms 10 below
    fail-rms 30), as the defaults do: else the warning could never be seen. The values
    compared are the project's where set, else the defaults."""
    for key in (k for k in known if k.startswith("warn-") and "fail-" + k[5:] in known):
        warn, fail = known[key], known["fail-" + key[5:]]
        if warn.name not in found and fail.name not in found:
            continue
        was = warn.default - fail.default
        now = found.get(warn.name, warn.default) - found.get(fail.name, fail.default)
        if now * was < 0:
            side = "above" if was > 0 else "below"
            raise source.error(
                (*path, key if key in found else fail.key),
                f"{key} = {found.get(warn.name, warn.default):g} must lie {side} {fail.key} = "
                f"{found.get(fail.name, fail.default):g}: a warning past the failure's bound "
                "could never be seen",
                hint=f"set both, keeping {key} {side} {fail.key} (defaults {warn.default:g} and "
                f"{fail.default:g})",
            )
