"""One trace event as msgspec decodes it (only the fields the metrics use), and the errors
of a trace that does not decode.

A slice of well-typed events decodes straight into :class:`Event` structs; a slice with a
field of an unexpected type is decoded event by event (:func:`loose`), and each odd event
goes through :func:`coerce`. What odd values become:

- an integer field (pid, tid, args.device, .stream, .correlation, .bytes, .rank, and the memory
  event's "Bytes", "Total Allocated", "Total Reserved", "Device Type", "Device Id") outside
  the 64 bits of the columns, or not an integer at all, is ignored, as if the event had none;
- a time (ts, dur) that is not a number is missing (the reader counts and warns); a number
  out of any range (``1e400``, a 400-digit integer, ``"inf"``, ``"nan"``) is kept as an
  infinity or NaN, so that the columns refuse the event by name (see
  :func:`dlci.profiling.columns.check_times`) rather than let it make "busy nan%".
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any

import msgspec

from dlci.errors import DlciError

Int64 = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]  # what a numpy column holds


class Args(msgspec.Struct, gc=False):
    device: Int64 | None = None
    stream: Int64 | None = None
    correlation: Int64 | None = None
    bytes: Int64 | None = None
    rank: Int64 | None = None  # a merged multi-rank trace's (TraceLens's TraceFuse sets it)
    # the fields of a ``[memory]`` instant event (torch.profiler's profile_memory=True)
    mem_bytes: Int64 | None = msgspec.field(default=None, name="Bytes")
    mem_allocated: Int64 | None = msgspec.field(default=None, name="Total Allocated")
    mem_reserved: Int64 | None = msgspec.field(default=None, name="Total Reserved")
    mem_device_type: Int64 | None = msgspec.field(default=None, name="Device Type")
    mem_device_id: Int64 | None = msgspec.field(default=None, name="Device Id")


class Event(msgspec.Struct, gc=False):
    ph: str = ""
    cat: str = ""
    name: str = ""
    pid: Int64 | str | None = None
    tid: Int64 | str | None = None
    ts: float | None = None
    dur: float | None = None
    args: Args | None = None


TYPED = msgspec.json.Decoder(list[Event])
PLAIN = msgspec.json.Decoder()
RAW_LIST = msgspec.json.Decoder(list[msgspec.Raw])
_ONE = msgspec.json.Decoder(Event)
_FIELDS = msgspec.json.Decoder(dict[str, msgspec.Raw])
_INT64 = (-(2**63), 2**63 - 1)


def _number(value: Any) -> float | None:
    """A float from a number or a numeric string (infinite when out of range), else None.

    >>> _number("1.5"), _number(True), _number("x"), _number(10**400), _number("nan")
    (1.5, None, None, inf, nan)
    """
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        try:
            return float(value)
        except OverflowError:
            return float("inf") if value > 0 else float("-inf")
    if isinstance(value, float):
        return value
    if isinstance(value, str) and len(value) < 400:
        try:
            return _number(float(value))
        except ValueError:
            return None
    return None


def _integer(value: Any) -> int | None:
    """An integer a 64-bit column can hold, else None.

    >>> _integer("3"), _integer(2.5), _integer(2**64), _integer(float("inf"))
    (3, None, None, None)
    """
    if isinstance(value, int) and not isinstance(value, bool):
        return value if _INT64[0] <= value <= _INT64[1] else None
    number = _number(value)
    if number is None or not number.is_integer() or not _INT64[0] <= number <= _INT64[1]:
        return None
    return int(number)


def _thread(value: Any) -> int | str | None:
    if isinstance(value, str):
        return value
    return _integer(value) if isinstance(value, int) else None


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
            rank=_integer(args.get("rank")),
            mem_bytes=_integer(args.get("Bytes")),
            mem_allocated=_integer(args.get("Total Allocated")),
            mem_reserved=_integer(args.get("Total Reserved")),
            mem_device_type=_integer(args.get("Device Type")),
            mem_device_id=_integer(args.get("Device Id")),
        )
    name = raw.get("name", "")
    return Event(
        ph=raw["ph"] if isinstance(raw.get("ph"), str) else "",
        cat=raw["cat"] if isinstance(raw.get("cat"), str) else "",
        name=name if isinstance(name, str) else _short(name),
        pid=_thread(raw.get("pid")),
        tid=_thread(raw.get("tid")),
        ts=_number(raw.get("ts")),
        dur=_number(raw.get("dur")),
        args=parsed_args,
    )


def _short(value: Any) -> str:
    """A name that is not a string, shown briefly (a list of a million items stays short)."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        text = repr(value) if not isinstance(value, int) or abs(value) < 10**50 else "<int>"
        return text
    return "" if value is None else f"<{type(value).__name__}>"


def _value(raw: msgspec.Raw, depth: int = 0) -> Any:
    """One field's value; a number msgspec finds out of range becomes an infinity."""
    try:
        return PLAIN.decode(raw)
    except msgspec.ValidationError:  # "Number out of range": 1e400 and the like
        if depth == 0:
            try:
                return {k: _value(v, 1) for k, v in _FIELDS.decode(raw).items()}
            except msgspec.ValidationError:
                pass
        return float("-inf") if bytes(raw).lstrip()[:1] == b"-" else float("inf")


def loose(raw: msgspec.Raw) -> Event | None:
    """One event of a slice that did not decode as typed events; None when not an object."""
    try:
        return _ONE.decode(raw)
    except msgspec.ValidationError:
        pass
    try:
        fields = _FIELDS.decode(raw)
    except msgspec.ValidationError:
        return None  # a number, a string, a list: not an event
    wanted = ("ph", "cat", "name", "pid", "tid", "ts", "dur", "args")
    return coerce({key: _value(fields[key]) for key in wanted if key in fields})


def trailer_keys(tail: bytes, bare: bool) -> dict[str, Any] | None:
    """The keys after the traceEvents array (``tail`` is what follows its ``]``), or None
    when ``tail`` cannot end the file."""
    if bare:
        return {} if not tail else None
    if tail == b"}":
        return {}
    if not (tail.startswith(b",") and tail.endswith(b"}")):
        return None
    try:
        value = PLAIN.decode(b"{" + tail[1:])
    except (msgspec.DecodeError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def header_keys(text: bytes) -> dict[str, Any]:
    """The keys before the traceEvents array (``text`` runs up to its key); {} if unreadable."""
    text = text.strip(b" \t\r\n")
    if not text or text == b"{":
        return {}
    body = text.rstrip(b" \t\r\n")
    if body.endswith(b","):
        body = body[:-1]
    try:
        value = PLAIN.decode(body + b"}")
    except (msgspec.DecodeError, RecursionError):
        return {}
    return value if isinstance(value, dict) else {}


# ---------------------------------------------------------------------------- errors


_BARE_NUMBER = re.compile(rb"[:,\[]\s*(-?Infinity|NaN)\s*[,}\]]")


def invalid_json(path: Path, offset: int, detail: str = "", text: bytes = b"") -> DlciError:
    """``text``: the slice that did not decode; a bare NaN or Infinity value in its first
    MiB (what Python's json.dump writes by default) is named instead of a guess."""
    found = _BARE_NUMBER.search(text[: 1 << 20])
    if found:
        token = found.group(1).decode()
        return DlciError(
            f"{path}: not valid JSON near byte {offset + found.start(1)} of the decompressed "
            f"trace: a bare {token} value, which JSON does not allow",
            hint="the trace was rewritten by a tool that writes NaN or Infinity (Python's "
            "json.dump does by default): write it with allow_nan=False, or export it again "
            "from torch.profiler",
        )
    return DlciError(
        f"{path}: not valid JSON near byte {offset} of the decompressed trace"
        + (f" ({detail})" if detail else ""),
        hint="the trace was cut short or corrupted; record it again "
        "(torch.profiler's export_chrome_trace writes it whole at the end)",
    )


def too_deep(path: Path, offset: int) -> DlciError:
    return DlciError(
        f"{path}: the event near byte {offset} of the decompressed trace nests JSON deeper "
        "than the reader allows (about 900 levels)",
        hint="torch.profiler writes events a few levels deep; this trace was not written by it",
    )


def not_a_trace(path: Path, why: str) -> DlciError:
    return DlciError(
        f"{path}: not a Kineto/Chrome trace: {why}",
        hint="give a trace written by torch.profiler (export_chrome_trace or "
        "tensorboard_trace_handler), a JSON object with a traceEvents array",
    )


def decimal_thread(value: Any) -> bool:
    """A thread id written as a string of a plain decimal integer: the same thread as that
    integer (Chrome's trace viewer, and the TensorBoard plugin, see one thread).

    >>> [decimal_thread(v) for v in ("25738", "0", "007", "stream 7", "١")]
    [True, True, False, False, False]
    """
    return (
        isinstance(value, str)
        and 0 < len(value) < 19
        and value.isascii()
        and value.isdigit()
        and (value == "0" or value[0] != "0")
    )


def no_events(path: Path, bare: bool, not_objects: int, unphased: int = 0) -> DlciError:
    """A trace whose events array holds no event object, or only objects without a phase
    (``"ph"``, which every trace event has): nothing to report on is not a report of
    nothing (an empty report with exit 0 would be a false success)."""
    where = "the JSON array" if bare else "its traceEvents array"
    if unphased:
        objects = "1 object" if unphased == 1 else f"{unphased:,} objects"
        what = f'holds {objects} and none has a phase ("ph"): no trace event'
    elif not_objects:
        what = f"holds {not_objects:,} values and no event object"
    else:
        what = "is empty"
    return not_a_trace(path, f"{where} {what}")
