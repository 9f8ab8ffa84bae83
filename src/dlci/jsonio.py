"""JSON in and out, one way: msgspec (fast, strict, and already the trace reader's decoder).

>>> encode({"loss": 0.5, "steps": [1, 2]}, indent=False)
b'{"loss":0.5,"steps":[1,2]}'
>>> decode(b'{"a": 1}')
{'a': 1}
"""

from __future__ import annotations

import os
from pathlib import Path, PurePath
from typing import Any

import msgspec

from dlci.fsutil import atomic_write_bytes

DecodeError = msgspec.DecodeError


def _default(value: Any) -> Any:
    """What msgspec cannot encode by itself: paths, subclasses of str (torch's version),
    and numpy scalars and arrays."""
    if isinstance(value, PurePath | str):
        return str(value)
    if hasattr(value, "tolist"):  # numpy scalars and arrays, without importing numpy
        return value.tolist()
    raise TypeError(f"cannot encode {type(value).__name__} as JSON")


_ENCODER = msgspec.json.Encoder(enc_hook=_default)


def encode(data: Any, *, indent: bool = True) -> bytes:
    """``data`` as JSON bytes; indented by two spaces and newline-terminated by default.

    NaN and infinities become ``null``, as JSON has no spelling for them.
    """
    blob = _ENCODER.encode(data)
    return msgspec.json.format(blob, indent=2) + b"\n" if indent else blob


def decode(blob: bytes | str) -> Any:
    """Parse JSON; raises ``DecodeError`` (with the byte position) on invalid input, and on
    arrays or objects nested past the interpreter's recursion limit (a hostile report)."""
    try:
        return msgspec.json.decode(blob)
    except RecursionError:
        raise DecodeError("arrays or objects nested too deeply") from None


def write(path: str | os.PathLike[str], data: Any) -> Path:
    """Write ``data`` as indented JSON, atomically."""
    return atomic_write_bytes(path, encode(data))


def describe(value: Any) -> str:
    """A value from a file, briefly, for a message: never huge, never a deep repr.

    >>> describe("x"), describe([1, 2]), describe(10**400), describe(True), describe(2.5)
    ("'x'", 'a list', 'an integer beyond 64 bits', 'true', '2.5')
    """
    if isinstance(value, bool) or value is None:
        return {True: "true", False: "false", None: "null"}[value]
    if isinstance(value, int) and abs(value) >= 2**63:
        return "an integer beyond 64 bits"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return repr(value[:40]) + ("..." if len(value) > 40 else "")
    return "an object" if isinstance(value, dict) else f"a {type(value).__name__}"
