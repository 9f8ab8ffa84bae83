"""The host's trusted configuration, as preflight recorded it: what the host's own checks read.

Host-side, never imports torch. ``dlci preflight`` resolves the configuration on the runner
before any of the pull request's code runs (on a pull request: trusted keys and the doctor's
waivers from the base commit, dlci.config.trust) and writes it into preflight.json as
``config``. The host's later steps (the gates' verdicts, the job summary, the baseline) read
it from the host's own copy of that file (the host record's ``preflight``), never from what a
container wrote. A preflight.json without ``config`` (an older one) reads as the defaults.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from dlci.policy import Policy, Waiver

GPU_GATES = ("min-gpu-util", "max-gpu-memory")


def snapshot(preflight: Any) -> dict[str, Any]:
    """The ``config`` section of a preflight report (``{}``: none, or not an object)."""
    config = preflight.get("config") if isinstance(preflight, dict) else None
    return config if isinstance(config, dict) else {}


def value(preflight: Any, key: str) -> Any:
    """One resolved value of the trusted configuration; None when unset.

    >>> value({"config": {"values": {"min-gpu-util": 40.0}}}, "min-gpu-util")
    40.0
    >>> value({}, "min-gpu-util") is None
    True
    """
    values = snapshot(preflight).get("values")
    return values.get(key) if isinstance(values, dict) else None


def number(preflight: Any, key: str) -> float | None:
    """A numeric value of the trusted configuration (None: unset or not a number)."""
    found = value(preflight, key)
    if isinstance(found, bool) or not isinstance(found, int | float):
        return None
    return float(found)


def gpu_gate(preflight: Any) -> bool:
    """Whether the trusted configuration asks for a GPU gate (min-gpu-util or max-gpu-memory).

    >>> gpu_gate({"config": {"values": {"max-gpu-memory": 90}}}), gpu_gate(None)
    (True, False)
    """
    return any(number(preflight, key) is not None for key in GPU_GATES)


def policy(preflight: Any) -> Policy:
    """The doctor's trusted policy: waivers and thresholds (no waiver when there is none).

    An unreadable policy gives no waiver: every waiver a report claims is then a false one.
    """
    data = snapshot(preflight).get("policy")
    if not isinstance(data, dict):
        return Policy(origin="defaults")
    try:
        return Policy.from_json(data)
    except (KeyError, TypeError, ValueError):
        return Policy(origin="an unreadable policy in preflight.json: no waiver")


def notes(preflight: Any) -> list[str]:
    """The configuration's notes (what a pull request changes, a base commit not read)."""
    found = snapshot(preflight).get("notes")
    return [str(n) for n in found[:50]] if isinstance(found, list) else []


def waiver_rows(preflight: Any, today: dt.date | None = None) -> list[dict[str, Any]]:
    """The trusted waivers for the job summary: check, mode, reason, until, where it was set."""
    rows = []
    for waiver in policy(preflight).waivers:
        rows.append({**waiver.to_json(), "expired": waiver.expired(today)})
    return rows


def expired(preflight: Any, today: dt.date | None = None) -> list[str]:
    """One failure per expired waiver of the trusted configuration, naming it."""
    return [_expired_text(w) for w in policy(preflight).waivers if w.expired(today)]


def _expired_text(waiver: Waiver) -> str:
    """
    >>> from dlci.policy import Waiver
    >>> _expired_text(Waiver("lr", "skip", "r", dt.date(2026, 1, 31), "dlci.toml:3"))[:59]
    'the waiver for lr (skip, dlci.toml:3) expired on 2026-01-31'
    """
    where = f", {waiver.source}" if waiver.source else ""
    return (
        f"the waiver for {waiver.check} ({waiver.mode}{where}) expired on {waiver.until}: "
        "fix the check or renew the waiver"
    )
