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
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import msgspec

from dlci.errors import DlciError

BLOCK = 4 << 20  # decompressed bytes read at a time
MAX_HEADER = 64 << 20  # a header this long without "traceEvents" is not a trace
MAX_EVENT = 64 << 20  # one event (or a run of bytes without a cut point) longer than this
DEFAULT_MAX_SIZE = 64 << 30  # decompressed bytes; a guard against gzip bombs

# Kind codes of device events.
KERNEL, MEMCPY, MEMSET, SYNC = 0, 1, 2, 3
DEVICE_CATEGORIES = {
    "kernel": KERNEL,
    "Kernel": KERNEL,
    "gpu_memcpy": MEMCPY,
    "Memcpy": MEMCPY,
    "gpu_memset": MEMSET,
    "Memset": MEMSET,
    "cuda_sync": SYNC,
}
RUNTIME_CATEGORIES = frozenset({"cuda_runtime", "Runtime", "cuda_driver", "hip_runtime"})
CPU_OP_CATEGORIES = frozenset({"cpu_op", "Operator", "operator"})
ANNOTATION_CATEGORIES = frozenset({"user_annotation"})
# Known and deliberately not used: GPU-side copies of annotations, flows, metadata, Python
# stack frames, the profiler's own overhead events, counters.
IGNORED_CATEGORIES = frozenset(
    {
        "gpu_user_annotation",
        "ac2g",
        "fwdbwd",
        "async_cpu_to_gpu",
        "Trace",
        "python_function",
        "Python",
        "overhead",
        "Overhead",
        "cpu_instant_event",
        "Memory",
        "cuda_profiler_range",
        "",
    }
)
STEP_PREFIX = "ProfilerStep#"
FLUSH_EVENTS = 200_000  # events kept as Python lists before they become numpy chunks
_I8, _I32, _I64, _F64 = "int8", "int32", "int64", "float64"
# kind, device, stream, ts, end, correlation, name, bytes
DEV_TYPES = (_I8, _I64, _I64, _F64, _F64, _I64, _I32, _I64)
# pid, tid, ts, end, correlation, name
RT_TYPES = (_I64, _I64, _F64, _F64, _I64, _I32)
# pid, tid, ts, end, name, annotation
OP_TYPES = (_I64, _I64, _F64, _F64, _I32, "bool")


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


_DECODER = msgspec.json.Decoder(list[Event])
_PLAIN = msgspec.json.Decoder()


@dataclass
class Columns:
    """The events the metrics need, one numpy array per field (times in microseconds)."""

    names: list[str]
    # device events: kernels, copies, sets, syncs
    dev_kind: Any
    dev_device: Any
    dev_stream: Any
    dev_ts: Any
    dev_end: Any
    dev_corr: Any
    dev_name: Any
    dev_bytes: Any
    # runtime calls on the host (cudaLaunchKernel, cudaStreamSynchronize, ...)
    rt_pid: Any
    rt_tid: Any
    rt_ts: Any
    rt_end: Any
    rt_corr: Any
    rt_name: Any
    # host ops and annotations
    op_pid: Any
    op_tid: Any
    op_ts: Any
    op_end: Any
    op_name: Any
    op_annotation: Any
    steps: list[tuple[int, float, float, int, int]]  # (number, start, end, pid, tid)
    gpu_step_starts: list[tuple[str, float]] = field(default_factory=list)
    header: dict[str, Any] = field(default_factory=dict)
    categories: Counter[str] = field(default_factory=Counter)
    unknown_categories: Counter[str] = field(default_factory=Counter)
    events: int = 0
    missing_duration: int = 0
    missing_timestamp: int = 0
    untyped_slices: int = 0
    time_scale: float = 1.0  # 1e-3 when the trace's timestamps were nanoseconds
    size_bytes: int = 0
    compressed: bool = False


class _Builder:
    def __init__(self) -> None:
        self.names: dict[str, int] = {}
        self.ids: dict[Any, int] = {}
        self.dev: tuple[list[Any], ...] = tuple([] for _ in range(8))
        self.rt: tuple[list[Any], ...] = tuple([] for _ in range(6))
        self.op: tuple[list[Any], ...] = tuple([] for _ in range(6))
        self.dev_chunks: list[list[Any]] = [[] for _ in range(8)]
        self.rt_chunks: list[list[Any]] = [[] for _ in range(6)]
        self.op_chunks: list[list[Any]] = [[] for _ in range(6)]
        self.steps: list[tuple[int, float, float, Any, Any]] = []
        self.gpu_step_starts: list[tuple[str, float]] = []
        self.categories: Counter[str] = Counter()
        self.unknown: Counter[str] = Counter()
        self.events = 0
        self.missing_duration = 0
        self.missing_timestamp = 0

    def name_id(self, name: str) -> int:
        found = self.names.get(name)
        if found is None:
            found = self.names[name] = len(self.names)
        return found

    def thread_id(self, value: Any) -> int:
        if type(value) is int:
            return value
        found = self.ids.get(value)
        if found is None:
            found = self.ids[value] = -1 - len(self.ids)  # strings become negative ids
        return found

    def add(self, events: list[Event]) -> None:
        self.events += len(events)
        groups: dict[str, list[Event]] = {}
        get = groups.get
        for event in events:
            bucket = get(event.cat)
            if bucket is None:
                bucket = groups[event.cat] = []
            bucket.append(event)
        for cat, group in groups.items():
            if cat in IGNORED_CATEGORIES:
                self.categories[cat] += len(group)
                if cat == "gpu_user_annotation":
                    self._gpu_steps(group)
                continue
            group = [e for e in group if e.ph == "X"]  # complete events; flows and marks aside
            if not group:
                continue
            self.categories[cat] += len(group)
            kind = DEVICE_CATEGORIES.get(cat)
            known = (
                kind is not None
                or cat in RUNTIME_CATEGORIES
                or cat in CPU_OP_CATEGORIES
                or cat in ANNOTATION_CATEGORIES
            )
            if not known:
                self.unknown[cat] += len(group)
                continue
            good = [e for e in group if e.ts is not None]
            self.missing_timestamp += len(group) - len(good)
            nodur = sum(1 for e in good if e.dur is None)
            self.missing_duration += nodur
            if nodur and kind is not None:
                good = [e for e in good if e.dur is not None]
            if kind is not None:
                self._device(kind, good)
            elif cat in RUNTIME_CATEGORIES:
                self._runtime(good)
            else:
                self._ops(good, cat in ANNOTATION_CATEGORIES)
        if len(self.dev[0]) + len(self.rt[0]) + len(self.op[0]) > FLUSH_EVENTS:
            self.flush()

    def _gpu_steps(self, group: list[Event]) -> None:
        """Starts of ProfilerStep annotations on the GPU timeline (HTA counts them)."""
        for e in group:
            if e.name.startswith(STEP_PREFIX) and e.ts is not None:
                a = e.args
                linked = a is not None and (a.stream or -1) >= 0 and (a.correlation or -1) >= 0
                if not linked:
                    self.gpu_step_starts.append((e.name, e.ts))

    def _names(self, group: list[Event]) -> list[int]:
        names = self.names
        get = names.get
        out = [get(e.name) for e in group]
        if None in out:
            for i, value in enumerate(out):
                if value is None:
                    out[i] = self.name_id(group[i].name)
        return out  # type: ignore[return-value]

    def _threads(self, values: list[Any]) -> list[int]:
        if set(map(type, values)) <= {int}:
            return values
        return [self.thread_id(v) for v in values]

    def _device(self, kind: int, group: list[Event]) -> None:
        kinds, devices, streams, starts, ends, corrs, names, sizes = self.dev
        none = Args()
        args = [e.args or none for e in group]
        kinds.extend([kind] * len(group))
        pairs = list(zip(group, args, strict=True))
        devices.extend(self._threads([e.pid if a.device is None else a.device for e, a in pairs]))
        streams.extend(self._threads([e.tid if a.stream is None else a.stream for e, a in pairs]))
        starts.extend([e.ts for e in group])
        ends.extend([e.ts + e.dur for e in group])  # type: ignore[operator]
        corrs.extend([-1 if a.correlation is None else a.correlation for a in args])
        names.extend(self._names(group))
        sizes.extend([a.bytes or 0 for a in args])

    def _runtime(self, group: list[Event]) -> None:
        pids, tids, starts, ends, corrs, names = self.rt
        pids.extend(self._threads([e.pid for e in group]))
        tids.extend(self._threads([e.tid for e in group]))
        starts.extend([e.ts for e in group])
        ends.extend([e.ts + (e.dur or 0.0) for e in group])  # type: ignore[operator]
        corrs.extend(
            [
                -1 if e.args is None or e.args.correlation is None else e.args.correlation
                for e in group
            ]
        )
        names.extend(self._names(group))

    def _ops(self, group: list[Event], annotation: bool) -> None:
        pids, tids, starts, ends, names, flags = self.op
        if annotation or any(e.name.startswith(STEP_PREFIX) for e in group):
            # user_annotation now, cpu_op in older traces
            kept = []
            for e in group:
                name = e.name
                if name.startswith(STEP_PREFIX) and name[len(STEP_PREFIX) :].isdigit():
                    end = e.ts + (e.dur or 0.0)  # type: ignore[operator]
                    self.steps.append((int(name[len(STEP_PREFIX) :]), e.ts, end, e.pid, e.tid))  # type: ignore[arg-type]
                else:
                    kept.append(e)
            group = kept
        pids.extend(self._threads([e.pid for e in group]))
        tids.extend(self._threads([e.tid for e in group]))
        starts.extend([e.ts for e in group])
        ends.extend([e.ts + (e.dur or 0.0) for e in group])  # type: ignore[operator]
        names.extend(self._names(group))
        flags.extend([annotation] * len(group))

    def flush(self) -> None:
        """Move the Python lists into numpy chunks: 30-40 bytes an event instead of ~200."""
        import numpy as np

        for lists, chunks, types in (
            (self.dev, self.dev_chunks, DEV_TYPES),
            (self.rt, self.rt_chunks, RT_TYPES),
            (self.op, self.op_chunks, OP_TYPES),
        ):
            if lists[0]:
                for values, chunk, dtype in zip(lists, chunks, types, strict=True):
                    chunk.append(np.asarray(values, dtype=dtype))
                    values.clear()

    def columns(self, header: dict[str, Any]) -> Columns:
        import numpy as np

        self.flush()

        def joined(chunks: list[list[Any]], types: tuple[Any, ...]) -> list[Any]:
            out = []
            for chunk, dtype in zip(chunks, types, strict=True):
                out.append(np.concatenate(chunk) if chunk else np.empty(0, dtype=dtype))
                chunk.clear()  # one field's chunks at a time: peak = columns + one field
            return out

        k, d, s, t, e, c, n, b = joined(self.dev_chunks, DEV_TYPES)
        rp, rt, rs, re_, rc, rn = joined(self.rt_chunks, RT_TYPES)
        op, ot, os_, oe, on, oa = joined(self.op_chunks, OP_TYPES)
        cols = Columns(
            names=list(self.names),
            dev_kind=k,
            dev_device=d,
            dev_stream=s,
            dev_ts=t,
            dev_end=e,
            dev_corr=c,
            dev_name=n,
            dev_bytes=b,
            rt_pid=rp,
            rt_tid=rt,
            rt_ts=rs,
            rt_end=re_,
            rt_corr=rc,
            rt_name=rn,
            op_pid=op,
            op_tid=ot,
            op_ts=os_,
            op_end=oe,
            op_name=on,
            op_annotation=oa,
            steps=sorted(
                {
                    (num, start, end, self.thread_id(pid), self.thread_id(tid))
                    for num, start, end, pid, tid in self.steps
                },
                key=lambda row: row[1],
            ),
            gpu_step_starts=self.gpu_step_starts,
            header=header,
            categories=self.categories,
            unknown_categories=self.unknown,
            events=self.events,
            missing_duration=self.missing_duration,
            missing_timestamp=self.missing_timestamp,
        )
        return cols


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
            from isal import igzip  # type: ignore[import-not-found]

            return igzip.IGzipFile(fileobj=raw, mode="rb"), True  # type: ignore[return-value]
        except ImportError:  # pragma: no cover - isal is a dependency, but optional in spirit
            return gzip.GzipFile(fileobj=raw, mode="rb"), True
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


def _decode(chunk: bytes, builder: _Builder, stats: dict[str, int]) -> bool:
    """Fold one slice of events into the builder; False when the slice is not valid JSON."""
    data = b"[" + chunk + b"]"
    try:
        events = _DECODER.decode(data)  # the structs are not tracked by the GC (gc=False)
    except msgspec.ValidationError:
        # A field of an unexpected type somewhere in the slice: decode it plainly and
        # coerce event by event (slow, but only for odd traces).
        try:
            raw = _PLAIN.decode(data)
        except msgspec.DecodeError:
            return False
        stats["untyped"] += 1
        events = [ev for ev in map(_coerce, raw) if ev is not None]
    except msgspec.DecodeError:
        return False
    builder.add(events)
    return True


def _number(value: Any) -> float | None:
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


def _coerce(raw: Any) -> Event | None:
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
    pid, tid = raw.get("pid"), raw.get("tid")
    return Event(
        ph=raw["ph"] if isinstance(raw.get("ph"), str) else "",
        cat=raw["cat"] if isinstance(raw.get("cat"), str) else "",
        name=raw["name"] if isinstance(raw.get("name"), str) else str(raw.get("name", "")),
        pid=pid if isinstance(pid, int | str) and not isinstance(pid, bool) else None,
        tid=tid if isinstance(tid, int | str) and not isinstance(tid, bool) else None,
        ts=_number(raw.get("ts")),
        dur=_number(raw.get("dur")),
        args=parsed_args,
    )


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
    _normalise_time(columns)
    return columns


def _scan(blocks: Iterator[bytes], path: Path) -> Columns:
    builder = _Builder()
    stats = {"untyped": 0}
    buf = b""
    consumed = 0  # bytes of the decompressed stream before buf
    eof = False

    def more() -> bool:
        nonlocal buf, eof
        if eof:
            return False
        block = next(blocks, b"")
        if not block:
            eof = True
            return False
        buf += block
        return True

    # 1. The header, up to the traceEvents array (or a bare array).
    searched = 0
    header_text = b""
    while True:
        stripped = buf.lstrip(_WS + b"\xef\xbb\xbf")
        if stripped[:1] == b"[":
            skip = len(buf) - len(stripped) + 1
            header_text = b""
            bare = True
            break
        if stripped and stripped[:1] != b"{":
            raise _not_a_trace(path, f"it starts with {stripped[:20]!r}")
        match = _START.search(buf, max(0, searched - 32))
        if match:
            header_text = buf[: match.start()]
            skip = match.end()
            bare = False
            break
        searched = len(buf)
        if len(buf) > MAX_HEADER:
            raise _not_a_trace(path, f"no traceEvents array in its first {MAX_HEADER >> 20} MiB")
        if not more():
            if not buf.strip():
                raise _not_a_trace(path, "the file is empty")
            try:
                _PLAIN.decode(buf)
            except msgspec.DecodeError as exc:
                raise _invalid(path, consumed, str(exc)) from None
            raise _not_a_trace(path, "it is JSON without a traceEvents array")
    header = _parse_header(header_text)
    consumed += skip
    buf = buf[skip:]

    # 2. The events: cut between events, decode each slice.
    while True:
        if not eof and len(buf) < BLOCK:
            more()
            continue
        if eof:
            trailer = _finish(buf, builder, stats, path, consumed, bare)
            header.update(trailer)
            break
        cut = _last_cut(buf, len(buf))
        tries = 0
        while cut > 0 and tries < 16:
            if _decode(buf[:cut], builder, stats):
                nxt = buf.index(b"{", cut)
                consumed += nxt
                buf = buf[nxt:]
                break
            cut = _last_cut(buf, cut - 1)
            tries += 1
        else:
            if len(buf) > MAX_EVENT:
                raise _invalid(path, consumed, "no event boundary found")
            if not more():
                continue
    columns = builder.columns(header)
    columns.untyped_slices = stats["untyped"]
    return columns


def _finish(
    buf: bytes, builder: _Builder, stats: dict[str, int], path: Path, consumed: int, bare: bool
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
                    trailer = _PLAIN.decode(b"{" + tail[1:])
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
        value = _PLAIN.decode(body + b"}")
    except msgspec.DecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def _normalise_time(columns: Columns) -> None:
    """Nanosecond timestamps (some exporters write them) become microseconds."""
    import numpy as np

    unit = str(columns.header.get("displayTimeUnit", "")).lower()
    starts = [a for a in (columns.dev_ts, columns.rt_ts, columns.op_ts) if a.size]
    if columns.steps:
        starts.append(np.asarray([s[1] for s in columns.steps]))
    if not starts:
        return
    largest = max(float(np.max(a)) for a in starts)
    # Microseconds since the epoch are about 1.8e15 today; nanoseconds are 1000 times that.
    if largest > 1e17 or (unit == "ns" and largest > 1e16):
        scale = 1e-3
        columns.time_scale = scale
        for name in ("dev_ts", "dev_end", "rt_ts", "rt_end", "op_ts", "op_end"):
            setattr(columns, name, getattr(columns, name) * scale)
        columns.steps = [
            (num, start * scale, end * scale, pid, tid)
            for num, start, end, pid, tid in columns.steps
        ]
        columns.gpu_step_starts = [(n, t * scale) for n, t in columns.gpu_step_starts]
