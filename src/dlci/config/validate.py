"""A configuration file's dl-ci table checked key by key: its values and the doctor's policy.

Every mistake of a file is reported at once, each located (dlci.schema): an unknown key
(with the nearest known one), a value of the wrong type or out of range, a waiver without a
reason, an unknown check ID, a threshold that check does not have, an ``until`` that is not a
date, a warning's bound past its failure's.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from dlci import schema
from dlci.config.keys import CONFIG_DOC, KEYS, WAIVER_KEYS
from dlci.config.source import TomlSource
from dlci.errors import SHOWN, DlciError
from dlci.policy import CHECK_IDS, Policy, Waiver, check_table, threshold_table

Values = dict[str, tuple[Any, str]]  # key -> (value, where it was set)
Path = tuple[str, ...]


def read_table(source: TomlSource, folder: str = "") -> tuple[Values, Policy]:
    """The keys a file sets (each with ``file:line``) and its policy (origin: the file), or
    every mistake in the table at once, each located.

    A relative ``ladder`` is resolved against ``folder``, the file's folder.
    """
    values: Values = {}
    errors: list[DlciError] = []
    policy = Policy(origin=source.display)
    for name, raw in source.data.items():
        if name == "doctor":
            policy = read_doctor(source, raw, errors)
        elif name in KEYS:
            try:
                values[name] = (KEYS[name].check(raw), source.where((name,)))
            except ValueError as exc:
                errors.append(source.error((name,), str(exc), hint=KEYS[name].hint))
        else:
            near = len(errors) < SHOWN  # the search for the first few keys only
            errors.append(source.error((name,), "unknown key", hint=_did_you_mean(name, near)))
    schema.raise_all(errors)
    if "ladder" in values:
        path, where = values["ladder"]
        values["ladder"] = (path if os.path.isabs(path) else os.path.join(folder, path), where)
    return values, policy


def _did_you_mean(name: str, near: bool = True) -> str:
    choices = [*KEYS, "doctor"]
    if name.replace("_", "-") in choices:
        return (
            f"did you mean '{name.replace('_', '-')}'? keys are kebab-case, as the action's inputs"
        )
    return schema.suggest(name, choices, "keys", near=near) + f" (see {CONFIG_DOC})"


def read_doctor(source: TomlSource, raw: Any, errors: list[DlciError]) -> Policy:
    """``[doctor.checks.<check-id>]`` tables: waivers and thresholds (mistakes to ``errors``)."""

    def add(path: Path, problem: str, hint: str | None = None) -> None:
        errors.append(source.error(path, problem, hint=hint))

    if not isinstance(raw, dict):
        add(("doctor",), "must be a table", "write [doctor.checks.<check-id>]")
        return Policy(origin=source.display)
    for key in raw:
        if key != "checks":
            add(("doctor", key), "unknown key", "the doctor's table holds checks")
    checks = raw.get("checks", {})
    if not isinstance(checks, dict):
        add(("doctor", "checks"), "must be a table of check IDs")
        checks = {}
    waivers: list[Waiver] = []
    thresholds: dict[str, float] = {}
    for check, table in checks.items():
        path = ("doctor", "checks", check)
        if check not in CHECK_IDS:
            add(path, "unknown check", schema.suggest(check, list(CHECK_IDS), "checks"))
        elif not isinstance(table, dict):
            add(path, "must be a table", "write waive, reason, until or thresholds")
        else:
            values, problems = schema.check(check_table(check), table, path)
            for p in problems:
                add(tuple(str(part) for part in p.path), p.message, p.hint)
            waiver = _waiver(source, path, table, values, add)
            waivers.extend([waiver] if waiver else [])
            found = {
                f"{check}.{key}": float(value)
                for key, value in values.items()
                if key in table and key not in WAIVER_KEYS
            }
            thresholds.update(found)
            _pairs_in_order(path, found, add)
    return Policy(waivers=tuple(waivers), thresholds=thresholds, origin=source.display)


def _waiver(
    source: TomlSource,
    path: Path,
    table: dict[str, Any],
    values: dict[str, Any],
    add: Callable[[Path, str, str | None], None],
) -> Waiver | None:
    """The waiver a check's table states, if it is whole: waive with a reason."""
    if "waive" not in table:
        for key in ("reason", "until"):
            if key in table:
                add((*path, key), "given without waive", WAIVER_KEYS["waive"])
        return None
    reason = table.get("reason")
    if not isinstance(reason, str) or not any(c.isalnum() for c in reason):  # not "\u200b"
        if not isinstance(reason, str) and "reason" in table:
            return None  # its type is reported already
        add(
            (*path, "reason" if "reason" in table else "waive"),
            "a waiver needs a reason (a non-empty text)",
            "say why the check is wrong for this model, e.g. reason = 'BatchNorm-free model'",
        )
        return None
    if values.get("waive") is None or ("until" in table and values.get("until") is None):
        return None  # a bad mode or date: reported already
    return Waiver(
        check=path[-1],
        mode=values["waive"],
        reason=reason.strip(),
        until=values.get("until"),
        source=source.where((*path, "waive")),
    )


def _pairs_in_order(
    path: Path, found: dict[str, float], add: Callable[[Path, str, str | None], None]
) -> None:
    """A warning's bound must lie on the passing side of its failure's (warn-rms 10 below
    fail-rms 30), as the defaults do: else the warning could never be seen. The values
    compared are the project's where set, else the defaults."""
    known = {t.key: t for t in threshold_table().values() if t.check == path[-1]}
    for key in (k for k in known if k.startswith("warn-") and "fail-" + k[5:] in known):
        warn, fail = known[key], known["fail-" + key[5:]]
        if warn.name not in found and fail.name not in found:
            continue
        was = warn.default - fail.default
        now = found.get(warn.name, warn.default) - found.get(fail.name, fail.default)
        if now * was < 0:
            side = "above" if was > 0 else "below"
            add(
                (*path, key if warn.name in found else fail.key),
                f"{key} = {found.get(warn.name, warn.default):g} must lie {side} {fail.key} = "
                f"{found.get(fail.name, fail.default):g}: a warning past the failure's bound "
                "could never be seen",
                f"set both, keeping {key} {side} {fail.key} (defaults {warn.default:g} and "
                f"{fail.default:g})",
            )
