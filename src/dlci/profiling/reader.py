"""Read a Kineto (Chrome trace format) file in bounded memory, into columnar arrays.

A trace is one JSON object whose ``traceEvents`` array holds millions of small objects.
Parsing it into Python dicts is what makes other tools slow and hungry (ANCHORS: 6 GB for
an 800 MB trace). Here the decompressed text is read in blocks (a thread decompresses the
next block while this one is parsed), cut between two events, and each slice is decoded by
msgspec into typed structs that keep only the fields the metrics use; the structs of one
slice are then folded into per-category numpy columns and dropped. Memory is the columns
plus two blocks, whatever the file's size.

Cutting between events needs no JSON parser of our own: a slice always starts at an event,
so cutting it at a ``}`` ``,`` ``{`` that lies inside a string leaves a half event at its end,
which msgspec rejects; the reader then cuts at the candidate before. Valid JSON is never
misread; invalid JSON is reported with its byte offset.

The same reader takes newer traces (``cpu_op``, ``kernel``, ``gpu_memcpy``, ...) and the
capitalised categories of 2021-era traces (``Operator``, ``Kernel``, ``Memcpy``, ...), the
bare-array form of the Chrome trace format, ``.json`` and ``.json.gz``.
"""

from __future__ import annotations

import contextlib
import gzip
import os
import queue
import re
import threading
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any, cast

import msgspec

from dlci.errors import DlciError
from dlci.profiling.columns import ColumnBuilder, Columns, normalise_time
from dlci.profiling.events import PLAIN, TYPED, coerce

__all__ = ["DEFAULT_MAX_SIZE", "Columns", "read_trace"]

BLOCK = 4 << 20  # decompressed bytes read at a time
MAX_HEADER = 64 << 20  # a header this long without "traceEvents" is not a trace
MAX_EVENT = 64 << 20  # one event (or a run of bytes without a cut point) longer than this
DEFAULT_MAX_SIZE = 64 << 30  # decompressed bytes; a guard against gzip bombs


# ---------------------------------------------------------------------------- byte stream


def _open(path: Path) -> tuple[IO[bytes], bool]:
    try:
        raw = open(path, "rb")  # noqa: SIM115 - closed by the caller
    except FileNotFoundError:
        raise DlciError(
            f"{path}: no such trace file",
            hint="give the path of a .json or .json.gz written by torch.profiler "
            "(dlci profile writes dlci-artifacts/trace.json.gz)",
        ) from None
    except IsADirectoryError:
        raise DlciError(
            f"{path}: is a directory, not a trace file",
            hint="name the trace file itself, for example DIR/trace.json.gz",
        ) from None
    except OSError as exc:
        raise DlciError(f"{path}: cannot read ({exc.strerror or exc})") from None
    magic = raw.read(2)
    raw.seek(0)
    if magic == b"\x1f\x8b":
        try:
            from isal import igzip

            handle: Any = igzip.IGzipFile(fileobj=raw, mode="rb")  # type: ignore[no-untyped-call]
        except ImportError:  # pragma: no cover - isal is a dependency, but optional in spirit
            handle = gzip.GzipFile(fileobj=raw, mode="rb")
        return cast(IO[bytes], handle), True
    return raw, False


def _blocks(handle: IO[bytes], path: Path, max_size: int) -> Iterator[bytes]:
    """Blocks of decompressed bytes; a thread reads ahead so decompression overlaps parsing."""
    results: queue.Queue[Any] = queue.Queue(maxsize=2)
    stop = threading.Event()

    def reader() -> None:
        total = 0
        try:
            while not stop.is_set():
                block = handle.read(BLOCK)
                total += len(block)
                if total > max_size:
                    raise DlciError(
                        f"{path}: more than {max_size / 2**30:.3g} GiB once decompressed",
                        hint="a trace this large is likely a gzip bomb or a whole job's "
                        "trace; profile fewer steps, or raise --max-size",
                    )
                results.put(block)
                if not block:
                    return
        except BaseException as exc:  # handed to the consumer, which raises it
            results.put(exc)

    thread = threading.Thread(target=reader, name="dlci-trace-reader", daemon=True)
    thread.start()
    try:
        while True:
            item = results.get()
            if isinstance(item, BaseException):
                raise _read_error(item, path)
            if not item:
                return
            yield item
    finally:
        stop.set()
        while thread.is_alive():
            try:
                results.get_nowait()
            except queue.Empty:
                thread.join(0.05)


def _read_error(exc: BaseException, path: Path) -> BaseException:
    if isinstance(exc, DlciError):
        return exc
    if isinstance(exc, EOFError):
        return DlciError(
            f"{path}: the compressed file is truncated ({exc})",
            hint="the profiler or the upload was interrupted; record the trace again",
        )
    if isinstance(exc, (OSError, zlib.error)) or type(exc).__name__ == "IsalError":
        return DlciError(
            f"{path}: cannot decompress ({exc})",
            hint="the file is not valid gzip; a plain JSON trace must not end in .gz",
        )
    return exc


# ---------------------------------------------------------------------------- the scanner

_START = re.compile(rb'"traceEvents"\s*:\s*\[')
_WS = b" \t\r\n"


def _last_cut(buf: bytes, before: int) -> int:
    """Index just after the ``}`` of the last ``}`` ``,`` ``{`` before ``before``, or -1."""
    pos = before
    while True:
        pos = buf.rfind(b"{", 0, pos)
        if pos <= 0:
            return -1
        i = pos - 1
        while i >= 0 and buf[i] in _WS:
            i -= 1
        if i >= 0 and buf[i] == 44:  # ','
            i -= 1
            while i >= 0 and buf[i] in _WS:
                i -= 1
            if i >= 0 and buf[i] == 125:  # '}'
                return i + 1


def _decode(chunk: bytes, builder: ColumnBuilder, stats: dict[str, int]) -> bool:
    """Fold one slice of events into the builder; False when the slice is not valid JSON."""
    data = b"[" + chunk + b"]"
    try:
        events = TYPED.decode(data)  # the structs are not tracked by the GC (gc=False)
    except msgspec.ValidationError:
        # A field of an unexpected type somewhere in the slice: decode it plainly and
        # coerce event by event (slow, but only for odd traces).
        try:
            raw = PLAIN.decode(data)
        except msgspec.DecodeError:
            return False
        stats["untyped"] += 1
        events = [ev for ev in map(coerce, raw) if ev is not None]
    except msgspec.DecodeError:
        return False
    builder.add(events)
    return True


def _invalid(path: Path, offset: int, detail: str = "") -> DlciError:
    return DlciError(
        f"{path}: not valid JSON near byte {offset} of the decompressed trace"
        + (f" ({detail})" if detail else ""),
        hint="the trace was cut short or corrupted; record it again "
        "(torch.profiler's export_chrome_trace writes it whole at the end)",
    )


def _not_a_trace(path: Path, why: str) -> DlciError:
    return DlciError(
        f"{path}: not a Kineto/Chrome trace: {why}",
        hint="give a trace written by torch.profiler (export_chrome_trace or "
        "tensorboard_trace_handler), a JSON object with a traceEvents array",
    )


def read_trace(path: str | os.PathLike[str], *, max_size: int = DEFAULT_MAX_SIZE) -> Columns:
    """Read a trace file into :class:`Columns`, in bounded memory."""
    path = Path(path)
    handle, compressed = _open(path)
    import gc

    enabled = gc.isenabled()
    gc.disable()  # millions of short-lived lists; nothing here makes reference cycles
    try:
        with handle:
            columns = _scan(_blocks(handle, path, max_size), path)
    finally:
        if enabled:
            gc.enable()
    columns.compressed = compressed
    with contextlib.suppress(OSError):
        columns.size_bytes = path.stat().st_size
    normalise_time(columns)
    return columns


class _Stream:
    """The decompressed bytes not parsed yet, and how many came before them."""

    def __init__(self, blocks: Iterator[bytes]) -> None:
        self.blocks = blocks
        self.buf = b""
        self.consumed = 0  # bytes of the decompressed stream before buf
        self.eof = False

    def more(self) -> bool:
        """Append the next block; False at the end of the stream."""
        if self.eof:
            return False
        block = next(self.blocks, b"")
        if not block:
            self.eof = True
            return False
        self.buf += block
        return True

    def drop(self, count: int) -> None:
        self.consumed += count
        self.buf = self.buf[count:]


def _scan(blocks: Iterator[bytes], path: Path) -> Columns:
    builder = ColumnBuilder()
    stats = {"untyped": 0}
    stream = _Stream(blocks)
    header, bare = _header(stream, path)
    # The events: cut between events, decode each slice.
    while True:
        if not stream.eof and len(stream.buf) < BLOCK:
            stream.more()
            continue
        if stream.eof:
            header.update(_finish(stream.buf, builder, stats, path, stream.consumed, bare))
            break
        if not _decode_some(stream, builder, stats):
            if len(stream.buf) > MAX_EVENT:
                raise _invalid(path, stream.consumed, "no event boundary found")
            stream.more()
    columns = builder.columns(header)
    columns.untyped_slices = stats["untyped"]
    return columns


def _decode_some(stream: _Stream, builder: ColumnBuilder, stats: dict[str, int]) -> bool:
    """Decode the events up to the last cut that gives valid JSON; False when none does."""
    buf = stream.buf
    cut = _last_cut(buf, len(buf))
    tries = 0
    while cut > 0 and tries < 16:
        if _decode(buf[:cut], builder, stats):
            stream.drop(buf.index(b"{", cut))
            return True
        cut = _last_cut(buf, cut - 1)
        tries += 1
    return False


def _header(stream: _Stream, path: Path) -> tuple[dict[str, Any], bool]:
    """The keys before the traceEvents array, and whether the trace is a bare array."""
    searched = 0
    while True:
        buf = stream.buf
        stripped = buf.lstrip(_WS + b"\xef\xbb\xbf")
        if stripped[:1] == b"[":
            stream.drop(len(buf) - len(stripped) + 1)
            return {}, True
        if stripped and stripped[:1] != b"{":
            raise _not_a_trace(path, f"it starts with {stripped[:20]!r}")
        match = _START.search(buf, max(0, searched - 32))
        if match:
            stream.drop(match.end())
            return _parse_header(buf[: match.start()]), False
        searched = len(buf)
        if len(buf) > MAX_HEADER:
            raise _not_a_trace(path, f"no traceEvents array in its first {MAX_HEADER >> 20} MiB")
        if not stream.more():
            if not buf.strip():
                raise _not_a_trace(path, "the file is empty")
            try:
                PLAIN.decode(buf)
            except msgspec.DecodeError as exc:
                raise _invalid(path, stream.consumed, str(exc)) from None
            raise _not_a_trace(path, "it is JSON without a traceEvents array")


def _finish(
    buf: bytes, builder: ColumnBuilder, stats: dict[str, int], path: Path, consumed: int, bare: bool
) -> dict[str, Any]:
    """The last events, the closing ``]`` and the keys after it."""
    body = buf.rstrip(_WS)
    pos = len(body)
    for _ in range(64):
        pos = body.rfind(b"]", 0, pos)
        if pos < 0:
            break
        head = body[:pos].rstrip(_WS)
        tail = body[pos + 1 :].strip(_WS)
        if head and head[-1:] not in (b"}",):
            continue
        if bare:
            if tail:
                continue
            trailer: dict[str, Any] = {}
        else:
            if not tail.endswith(b"}"):
                continue
            if tail == b"}":
                trailer = {}
            elif tail.startswith(b","):
                try:
                    trailer = PLAIN.decode(b"{" + tail[1:])
                except msgspec.DecodeError:
                    continue
            else:
                continue
        if not head or _decode(head, builder, stats):
            return trailer if isinstance(trailer, dict) else {}
    if not body.rstrip(b"}]" + _WS):
        return {}
    raise _invalid(
        path,
        consumed + len(buf),
        "the traceEvents array or the file ends early" if buf else "the file ends early",
    )


def _parse_header(text: bytes) -> dict[str, Any]:
    text = text.strip(_WS)
    if not text or text == b"{":
        return {}
    body = text.rstrip(_WS)
    if body.endswith(b","):
        body = body[:-1]
    try:
        value = PLAIN.decode(body + b"}")
    except msgspec.DecodeError:
        return {}
    return value if isinstance(value, dict) else {}
