"""Read a Kineto (Chrome trace format) file in bounded memory and linear time, into columns.

A trace is one JSON object whose ``traceEvents`` array holds millions of small objects;
parsing them into dicts makes other tools slow. The decompressed text is read in blocks (a
thread decompresses ahead), cut between two events; each slice is decoded by msgspec into
typed structs keeping only the fields the metrics use, folded into per-category numpy
columns and dropped. Memory: the columns plus two blocks (or one event, up to
``MAX_EVENT``), whatever the file's size.

Cutting between events needs no JSON parser of our own: a slice always starts at an event,
so cutting it at a ``}`` ``,`` ``{`` inside a string leaves a half event, which msgspec
rejects. After two such refusals (a string full of ``},{``) the reader walks the events one
by one with msgspec instead (:meth:`_Slices.walk`), so the cost stays linear whatever the
content: valid JSON is never misread, invalid JSON is reported with its byte offset. It
takes 2021's capitalised categories too, the bare-array form, ``.json`` and ``.json.gz``; an
array without one event object is refused (a located error, not an empty report).
"""

from __future__ import annotations

import contextlib
import gc
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
from dlci.fsutil import open_input
from dlci.profiling.columns import (
    NOT_AN_OBJECT,
    ColumnBuilder,
    Columns,
    ImpossibleTimeError,
    normalise_time,
)
from dlci.profiling.events import (
    PLAIN,
    RAW_LIST,
    TYPED,
    header_keys,
    invalid_json,
    loose,
    no_events,
    not_a_trace,
    too_deep,
    trailer_keys,
)

__all__ = ["DEFAULT_MAX_SIZE", "Columns", "read_trace"]

BLOCK = 4 << 20  # decompressed bytes read at a time
MAX_HEADER = 64 << 20  # a header this long without "traceEvents" is not a trace
MAX_EVENT = 64 << 20  # one event (or a run of bytes without a cut point) longer than this
DEFAULT_MAX_SIZE = 64 << 30  # decompressed bytes; a guard against gzip bombs


# ---------------------------------------------------------------------------- byte stream


def _open(path: Path, max_size: int) -> tuple[IO[bytes], bool]:
    raw = open_input(
        path,
        what="trace file",
        limit=max_size,
        hint="give the path of a .json or .json.gz written by torch.profiler "
        "(dlci profile writes dlci-artifacts/trace.json.gz)",
    )
    try:
        magic = raw.read(2)
        raw.seek(0)
    except OSError as exc:
        raw.close()
        raise DlciError(f"{path}: cannot read ({exc.strerror or exc})") from None
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
_NON_WS = re.compile(rb"[^ \t\r\n]")
# a cut: the end of one event, a comma, the start of the next (whitespace bounded, so that
# checking one candidate costs the same whatever the text around it)
_CUT_BEFORE = re.compile(rb"\}[ \t\r\n]{0,64},[ \t\r\n]{0,64}\Z")
_TRAILING = re.compile(r"trailing characters \(byte (\d+)\)")
_RAW = msgspec.json.Decoder(msgspec.Raw)
FAST_TRIES = 2  # cut points tried by decoding before the walk takes over
CUT_CANDIDATES = 4096  # '{' looked at when searching back for a cut point


def _last_cut(buf: bytes, before: int) -> int:
    """Index just after the ``}`` of the last ``}`` ``,`` ``{`` before ``before``, or -1.

    At most ``CUT_CANDIDATES`` braces are looked at: text full of braces that are not cut
    points is left to the walk (:meth:`_Slices.walk`), which is linear.
    """
    pos = before
    for _ in range(CUT_CANDIDATES):
        pos = buf.rfind(b"{", 0, pos)
        if pos <= 0:
            return -1
        match = _CUT_BEFORE.search(buf, max(0, pos - 160), pos)
        if match:
            return match.start() + 1
    return -1


def read_trace(path: str | os.PathLike[str], *, max_size: int = DEFAULT_MAX_SIZE) -> Columns:
    """Read a trace file into :class:`Columns`, in bounded memory and linear time."""
    path = Path(path)
    handle, compressed = _open(path, max_size)

    enabled = gc.isenabled()
    gc.disable()  # millions of short-lived lists; nothing here makes reference cycles
    try:
        with handle:
            columns = _Slices(path).scan(_blocks(handle, path, max_size))
    except ImpossibleTimeError as exc:
        raise DlciError(
            f"{path}: {exc}",
            hint="times are microseconds (or nanoseconds) since some origin; this trace was "
            "not written by torch.profiler, or was edited",
        ) from None
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
        self.want = BLOCK  # bytes to hold before the next attempt to decode

    def fill(self, size: int) -> bool:
        """Append blocks until ``size`` bytes are held (one copy); False at the end."""
        parts = [self.buf]
        held = len(self.buf)
        while held < size and not self.eof:
            block = next(self.blocks, b"")
            if not block:
                self.eof = True
            held += len(block)
            parts.append(block)
        self.buf = b"".join(parts)
        return not self.eof

    def drop(self, count: int) -> None:
        self.consumed += count
        self.buf = self.buf[count:]


class _Slices:
    """Slices of events decoded into a :class:`ColumnBuilder`.

    Cost is linear in the input whatever its content: the fast path decodes up to the last
    cut point (one try, rarely two); when that fails (a string full of ``},{``, an event
    longer than a block) :meth:`walk` finds whole events with msgspec, one event at a time,
    and an event not whole yet waits until the buffer has doubled.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.builder = ColumnBuilder()
        self.untyped = 0
        self.not_objects = 0  # values of the events array that are not JSON objects

    def scan(self, blocks: Iterator[bytes]) -> Columns:
        stream = _Stream(blocks)
        header, bare = _header(stream, self.path)
        while True:
            if not stream.eof and len(stream.buf) < stream.want:
                stream.fill(stream.want)
                continue
            if stream.eof:
                header.update(self.finish(stream.buf, stream.consumed, bare))
                break
            if self.decode_some(stream):
                stream.want = BLOCK
            elif len(stream.buf) > MAX_EVENT:
                raise invalid_json(
                    self.path,
                    stream.consumed,
                    f"an event longer than {MAX_EVENT >> 20} MiB, or no event boundary",
                )
            else:
                stream.want = min(2 * len(stream.buf), MAX_EVENT + BLOCK)
        if not self.builder.events:
            raise no_events(self.path, bare, self.not_objects)
        if not self.builder.phased:  # [{}]: objects, but none a trace event
            raise no_events(self.path, bare, self.not_objects, self.builder.events)
        columns = self.builder.columns(header)
        columns.untyped_slices = self.untyped
        if self.not_objects:  # a number or a string among the events: read, not usable
            columns.events += self.not_objects
            columns.dropped[NOT_AN_OBJECT] += self.not_objects
        return columns

    def decode(self, chunk: bytes, offset: int) -> bool:
        """Fold one slice of events into the builder; False when it is not valid JSON."""
        data = b"[" + chunk + b"]"
        try:
            try:
                events = TYPED.decode(data)  # the structs are not tracked by the GC (gc=False)
            except msgspec.ValidationError:
                # a field of an unexpected type in the slice: event by event (odd traces only)
                self.untyped += 1
                values = RAW_LIST.decode(data)
                events = [e for e in map(loose, values) if e is not None]
                self.not_objects += len(values) - len(events)
        except msgspec.DecodeError:
            return False
        except RecursionError:
            raise too_deep(self.path, offset) from None
        self.builder.add(events)
        return True

    def value_end(self, view: memoryview, pos: int, offset: int) -> int:
        """Index of the first byte after the JSON value at ``pos`` and its whitespace, or
        -1 when the value is not whole in ``view`` (or not valid)."""
        try:
            _RAW.decode(view[pos:])
        except RecursionError:
            raise too_deep(self.path, offset + pos) from None
        except msgspec.DecodeError as exc:
            found = _TRAILING.search(str(exc))
            return pos + int(found.group(1)) - 1 if found else -1
        return -1  # the value runs to the end: whether it is whole, only more bytes tell

    def walk(self, buf: bytes, offset: int) -> tuple[int, int, int]:
        """Whole events from the start of ``buf``: ``(end, next, stop)``.

        ``end`` is where the last event followed by a comma ends and ``next`` where the one
        after it starts (both 0 when there is none); ``stop`` is the index of the first byte
        after the events that is not a comma (``]`` at the end of the array), or -1.
        """
        view = memoryview(buf)
        end = nxt = pos = 0
        while True:
            found = _NON_WS.search(buf, pos)
            if found is None:
                return end, nxt, -1
            if buf[found.start()] == 93 and pos == 0:  # ']': the array is empty
                return end, nxt, found.start()
            stop = self.value_end(view, found.start(), offset)
            if stop < 0 or buf[stop] != 44:  # ','
                return end, nxt, stop
            end, nxt = stop, stop + 1
            pos = nxt

    def decode_some(self, stream: _Stream) -> bool:
        """Decode the whole events at the start of the buffer; False when none is whole."""
        buf = stream.buf
        cut = _last_cut(buf, len(buf))
        for _ in range(FAST_TRIES):
            if cut <= 0:
                break
            if self.decode(buf[:cut], stream.consumed):
                stream.drop(buf.index(b"{", cut))
                return True
            cut = _last_cut(buf, cut - 1)
        end, nxt, _ = self.walk(buf, stream.consumed)
        if end == 0:
            return False
        if not self.decode(buf[:end], stream.consumed):
            raise invalid_json(self.path, stream.consumed, text=buf[:end])
        stream.drop(nxt)
        return True

    def finish(self, buf: bytes, consumed: int, bare: bool) -> dict[str, Any]:
        """The last events, the closing ``]`` and the keys after it."""
        body = buf.rstrip(_WS)
        pos = len(body)
        for _ in range(FAST_TRIES):  # the fast path: the last ']' or the one before
            pos = body.rfind(b"]", 0, pos)
            if pos < 0:
                break
            head = body[:pos].rstrip(_WS)
            trailer = trailer_keys(body[pos + 1 :].strip(_WS), bare)
            fits = trailer is not None and (not head or head[-1:] == b"}")
            if fits and (not head or self.decode(head, consumed)):
                return trailer  # type: ignore[return-value]
        _, _, stop = self.walk(buf, consumed)  # the slow path, linear: event by event
        if stop >= 0 and buf[stop] == 93:  # ']'
            trailer = trailer_keys(buf[stop + 1 :].strip(_WS), bare)
            if trailer is not None:
                if buf[:stop].strip(_WS) and not self.decode(buf[:stop], consumed):
                    raise invalid_json(self.path, consumed, text=buf[:stop])
                return trailer
        if not body.rstrip(b"}]" + _WS):
            return {}
        where = consumed + (stop if stop >= 0 else len(buf))
        raise invalid_json(
            self.path,
            where,
            "the traceEvents array or the file ends early" if buf else "the file ends early",
            text=buf,
        )


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
            raise not_a_trace(path, f"it starts with {stripped[:20]!r}")
        match = _START.search(buf, max(0, searched - 32))
        if match:
            stream.drop(match.end())
            return header_keys(buf[: match.start()]), False
        searched = len(buf)
        if len(buf) > MAX_HEADER:
            raise not_a_trace(path, f"no traceEvents array in its first {MAX_HEADER >> 20} MiB")
        if not stream.fill(len(stream.buf) + 1):
            if not buf.strip():
                raise not_a_trace(path, "the file is empty")
            try:
                PLAIN.decode(buf)
            except msgspec.DecodeError as exc:
                raise invalid_json(path, stream.consumed, str(exc)) from None
            except RecursionError:
                raise too_deep(path, stream.consumed) from None
            raise not_a_trace(path, "it is JSON without a traceEvents array")
