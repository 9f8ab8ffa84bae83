"""The resolved configuration as ``dlci config`` prints it: a row per key, the waivers, the
thresholds a project changed, the notes. Values come from files: every one goes through
``clean`` on its way to the terminal."""

from __future__ import annotations

import datetime as dt
from typing import Any

from dlci.config.keys import KEYS
from dlci.config.resolve import Config
from dlci.policy import Waiver, threshold_table
from dlci.report.text import clean


def show_value(value: Any) -> str:
    """A value as ``dlci config`` shows it.

    >>> show_value(None), show_value(40.0), show_value(["-k", "not slow"])
    ('(unset)', '40', "-k 'not slow'")
    """
    import shlex

    if value is None:
        return "(unset)"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, list):
        return shlex.join(value)
    return str(value)


def expired(config: Config, today: dt.date | None = None) -> list[Waiver]:
    """The waivers whose ``until`` has passed."""
    return [w for w in config.policy.waivers if w.expired(today)]


def waiver_line(waiver: Waiver, today: dt.date | None = None) -> str:
    """One waiver in words, with its reason, expiry and where it was set."""
    until = f"until {waiver.until.isoformat()}" if waiver.until else "no expiry"
    if waiver.expired(today):
        until = f"EXPIRED (until {waiver.until})"
    return (
        f"{clean(waiver.check)}: {waiver.mode}, {until}, set at {clean(waiver.source)}; "
        f"reason: {clean(waiver.reason, limit=300)}"
    )


def describe(config: Config, today: dt.date | None = None) -> list[str]:
    """The lines ``dlci config`` prints."""
    lines = [
        f"configuration file: {clean(config.file)}"
        if config.file
        else "configuration file: none (dlci.toml, or [tool.dlci] in pyproject.toml)"
    ]
    rows = [("key", "value", "from")]
    rows += [(k, clean(show_value(config.get(k)), limit=80), clean(config.source(k))) for k in KEYS]
    widths = [max(len(r[i]) for r in rows) for i in range(2)]
    lines += [f"  {r[0]:<{widths[0]}}  {r[1]:<{widths[1]}}  {r[2]}".rstrip() for r in rows]
    lines.append(f"waivers ({clean(config.policy.origin) or 'defaults'}):")
    lines += [f"  {waiver_line(w, today)}" for w in config.policy.waivers] or ["  none"]
    table = threshold_table()
    changed = sorted(
        (name, value)
        for name, value in config.policy.thresholds.items()
        if name not in table or value != table[name].default
    )
    lines.append("thresholds that differ from the defaults:")
    lines += [
        f"  {clean(name)} = {value:g} (default {table[name].default:g})"
        if name in table
        else f"  {clean(name)} = {value:g}"
        for name, value in changed
    ] or ["  none"]
    if config.notes:
        lines.append("notes:")
        lines += [f"  - {clean(note, limit=500)}" for note in config.notes]
    return lines
