"""One trace event as msgspec decodes it: only the fields the metrics use.

A slice of well-typed events decodes straight into :class:`Event` structs; a slice with a
field of an unexpected type is decoded plainly and each event goes through :func:`coerce`.
"""

from __future__ import annotations

from typing import Any

import msgspec


class Args(msgspec.Struct, gc=False):
    device: int | None = None
    stream: int | None = None
    correlation: int | None = None
    bytes: int | None = None


class Event(msgspec.Struct, gc=False):
    ph: str = ""
    cat: str = ""
    name: str = ""
    pid: int | str | None = None
    tid: int | str | None = None
    ts: float | None = None
    dur: float | None = None
    args: Args | None = None


TYPED = msgspec.json.Decoder(list[Event])
PLAIN = msgspec.json.Decoder()


def _number(value: Any) -> float | None:
    """A finite number from a number or a numeric string, else None.

    >>> _number("1.5"), _number(True), _number(float("nan"))
    (1.5, None, None)
    """
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value) if value == value and abs(value) != float("inf") else None
    if isinstance(value, str):
        try:
            return _number(float(value))
        except ValueError:
            return None
    return None


def _integer(value: Any) -> int | None:
    number = _number(value)
    return int(number) if number is not None and number.is_integer() else None


def _thread(value: Any) -> int | str | None:
    return value if isinstance(value, int | str) and not isinstance(value, bool) else None


def coerce(raw: Any) -> Event | None:
    """An :class:`Event` from a plainly decoded one, fields of odd types made usable or None.

    >>> event = coerce({"ph": "X", "ts": "10", "dur": 2, "args": {"device": "0"}})
    >>> event.ts, event.dur, event.args.device
    (10.0, 2.0, 0)
    """
    if not isinstance(raw, dict):
        return None
    args = raw.get("args")
    parsed_args = None
    if isinstance(args, dict):
        parsed_args = Args(
            device=_integer(args.get("device")),
            stream=_integer(args.get("stream")),
            correlation=_integer(args.get("correlation")),
            bytes=_integer(args.get("bytes")),
        )
    return Event(
        ph=raw["ph"] if isinstance(raw.get("ph"), str) else "",
        cat=raw["cat"] if isinstance(raw.get("cat"), str) else "",
        name=raw["name"] if isinstance(raw.get("name"), str) else str(raw.get("name", "")),
        pid=_thread(raw.get("pid")),
        tid=_thread(raw.get("tid")),
        ts=_number(raw.get("ts")),
        dur=_number(raw.get("dur")),
        args=parsed_args,
    )
