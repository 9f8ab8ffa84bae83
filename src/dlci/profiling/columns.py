"""The events a trace's metrics need, folded into per-category numpy columns.

:class:`ColumnBuilder` takes the decoded events of one slice at a time, keeps the device
events, runtime calls, host ops, ProfilerStep markers (and [memory] events: memcols.py) as
Python lists, and moves them into numpy chunks every ``FLUSH_EVENTS`` events (30-40 bytes
an event instead of ~200);
:meth:`ColumnBuilder.columns` joins the chunks into one :class:`Columns`.

Every event is counted once as it passes: used (folded into a column), skipped (a kind the
figures never need: metadata, counters, flows, marks, the ``_IGNORED`` categories) or
dropped for one of ``DROP_REASONS``, from the lengths of the per-category groups the fold
makes anyway; only a group whose events are not all complete ones is walked once more, for
its phases (:meth:`ColumnBuilder._unknown_phases`).
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dlci.profiling.events import Args, Event, decimal_thread
from dlci.profiling.memcols import MEMORY_CATEGORIES, MemoryBuilder, MemoryColumns

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
_HOST_CATEGORIES = RUNTIME_CATEGORIES | CPU_OP_CATEGORIES | ANNOTATION_CATEGORIES
# Known and deliberately not used: GPU-side copies of annotations, flows, metadata, Python
# stack frames, the profiler's own overhead events, counters.
_IGNORED = (
    "gpu_user_annotation ac2g fwdbwd async_cpu_to_gpu Trace python_function Python overhead "
    "Overhead cpu_instant_event Memory cuda_profiler_range"
)
IGNORED_CATEGORIES = frozenset({"", *_IGNORED.split()})
# Phases the figures never need, whatever the category: metadata, counters, flow arrows and
# instant marks (a [memory] instant is taken before this applies). The reader uses complete
# events ("X"); any other phase of a category it uses (begin/end pairs, async spans, object
# snapshots, samples) is dropped and counted as "phase not handled".
SKIPPED_PHASES = frozenset({"M", "C", "s", "t", "f", "i", "I", "R"})
# Why an event was dropped: the keys of Columns.dropped (docs/profiling.md, "trace.read")
NO_CATEGORY = "no category"
PHASE_NOT_HANDLED = "phase not handled"
UNKNOWN_CATEGORY = "unknown category"
NO_TIMESTAMP = "no timestamp"
NO_DURATION = "no duration"
NOT_AN_OBJECT = "not an event object"
BAD_MEMORY_EVENT = "unreadable [memory] event"
DROP_REASONS = (
    NO_CATEGORY,
    PHASE_NOT_HANDLED,
    UNKNOWN_CATEGORY,
    NO_TIMESTAMP,
    NO_DURATION,
    NOT_AN_OBJECT,
    BAD_MEMORY_EVENT,
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
    # pid -> the args.rank values of its ProfilerStep markers (a merged trace's)
    step_ranks: dict[int, set[int]] = field(default_factory=dict)
    gpu_step_starts: list[tuple[str, float]] = field(default_factory=list)
    header: dict[str, Any] = field(default_factory=dict)
    memory: MemoryColumns = field(default_factory=MemoryColumns.empty)  # [memory] events
    categories: Counter[str] = field(default_factory=Counter)
    unknown_categories: Counter[str] = field(default_factory=Counter)
    events: int = 0
    used: int = 0  # events read into the columns: device events, runtime calls, ops, steps
    skipped: int = 0  # events of kinds the figures do not need (SKIPPED_PHASES, _IGNORED)
    dropped: Counter[str] = field(default_factory=Counter)  # reason -> events (DROP_REASONS)
    missing_duration: int = 0
    missing_timestamp: int = 0
    untyped_slices: int = 0
    time_scale: float = 1.0  # 1e-3 when the trace's timestamps were nanoseconds
    size_bytes: int = 0
    compressed: bool = False


MAX_NAME = 4096  # characters of an event name kept (C++ template kernels reach ~1500)
MAX_TIME = 1e19  # microseconds (317,000 years), or nanoseconds since 1970 (317 years)


class ImpossibleTimeError(ValueError):
    """An event whose time is not finite or beyond any clock (``ts`` or ``dur`` near 1e308)."""


def check_times(
    what: str, starts: Any, ends: Any, names: Any, lookup: Callable[[int], str]
) -> None:
    """Refuse, by its name, the first event whose start or end is not a finite time within
    ``MAX_TIME``: one such event makes every share "nan%" or 0%.

    >>> import numpy as np
    >>> try:
    ...     check_times("a kernel", np.array([1.0, 1e308]), np.array([2.0, np.inf]),
    ...                 np.array([0, 1]), ["ok", "bad"].__getitem__)
    ... except ImpossibleTimeError as exc:
    ...     print(exc)
    a kernel 'bad' has an impossible time: ts 1e+308 us, dur inf us
    """
    import numpy as np

    with np.errstate(invalid="ignore"):
        good = (np.abs(starts) <= MAX_TIME) & (np.abs(ends) <= MAX_TIME)
    if good.all():
        return
    i = int(np.argmin(good))
    start, end = float(starts[i]), float(ends[i])
    name = lookup(int(names[i])) if names is not None else "ProfilerStep"
    raise ImpossibleTimeError(
        f"{what} {name[:200]!r} has an impossible time: ts {start:g} us, dur {end - start:g} us"
    )


class ColumnBuilder:
    """Decoded events in, :class:`Columns` out; see the module docstring."""

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
        self.step_ranks: dict[Any, set[int]] = {}
        self.gpu_step_starts: list[tuple[str, float]] = []
        self.categories: Counter[str] = Counter()
        self.unknown: Counter[str] = Counter()
        self.used = 0
        self.skipped = 0
        self.dropped: Counter[str] = Counter()
        self.events = 0
        self.phased = False  # whether any event has a phase ("ph"): a trace event at all
        self.missing_duration = 0
        self.missing_timestamp = 0
        self.memory = MemoryBuilder()

    def name_id(self, name: str) -> int:
        found = self.names.get(name)
        if found is None:
            if len(name) > MAX_NAME:  # every name is matched against patterns: keep them short
                return self.name_id(name[:MAX_NAME])
            found = self.names[name] = len(self.names)
        return found

    def thread_id(self, value: Any) -> int:
        if type(value) is int:
            return value
        found = self.ids.get(value)
        if found is None:  # "25738" is thread 25738 (2021: ops on "25738", [memory] on 25738)
            found = int(value) if decimal_thread(value) else -2 - len(self.ids)  # -1: no stream
            self.ids[value] = found
        return found

    def add(self, events: list[Event]) -> None:
        self.events += len(events)
        if not self.phased:
            self.phased = any(e.ph for e in events)
        groups: dict[str, list[Event]] = {}
        get = groups.get
        for event in events:
            bucket = get(event.cat)
            if bucket is None:
                bucket = groups[event.cat] = []
            bucket.append(event)
        for cat, group in groups.items():
            self.categories[cat] += len(group)
            memory = self.memory.add(group, self._threads) if cat in MEMORY_CATEGORIES else 0
            if cat in IGNORED_CATEGORIES:
                if cat:
                    self.skipped += len(group) - memory
                else:  # no category: metadata and marks are fine, anything else is lost
                    self._unknown_phases(group, memory, 0, NO_CATEGORY)
                if cat == "gpu_user_annotation":
                    self._gpu_steps(group)
                continue
            complete = [e for e in group if e.ph == "X"]  # flows and marks aside
            kind = DEVICE_CATEGORIES.get(cat)
            known = kind is not None or cat in _HOST_CATEGORIES
            if len(complete) != len(group):  # flows, marks or phases it does not read
                reason = PHASE_NOT_HANDLED if known else UNKNOWN_CATEGORY
                lost = self._unknown_phases(group, memory, len(complete), reason)
                if lost and not known:
                    self.unknown[cat] += lost
            if not complete:
                continue
            if not known:
                self.unknown[cat] += len(complete)
                self.dropped[UNKNOWN_CATEGORY] += len(complete)
                continue
            group = complete
            good = [e for e in group if e.ts is not None]
            if len(good) != len(group):
                self.missing_timestamp += len(group) - len(good)
                self.dropped[NO_TIMESTAMP] += len(group) - len(good)
            nodur = sum(1 for e in good if e.dur is None)
            self.missing_duration += nodur
            if nodur and kind is not None:
                good = [e for e in good if e.dur is not None]
                self.dropped[NO_DURATION] += nodur
            self.used += len(good)
            if kind is not None:
                self._device(kind, good)
            elif cat in RUNTIME_CATEGORIES:
                self._runtime(good)
            else:
                self._ops(good, cat in ANNOTATION_CATEGORIES)
        if len(self.dev[0]) + len(self.rt[0]) + len(self.op[0]) > FLUSH_EVENTS:
            self.flush()

    def _unknown_phases(self, group: list[Event], memory: int, complete: int, reason: str) -> int:
        """Count the events of ``group`` that are neither [memory] events (``memory``, read)
        nor ``complete`` events (handled by the caller): those of a phase the figures never
        need are skipped, the others are dropped for ``reason``. Returns how many were."""
        marks = sum(1 for e in group if e.ph in SKIPPED_PHASES) - memory  # [memory]: "i"
        lost = len(group) - memory - complete - marks
        self.skipped += marks
        self.dropped[reason] += lost
        return lost

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
                number = name[len(STEP_PREFIX) :]
                if name.startswith(STEP_PREFIX) and number.isascii() and number.isdigit():
                    end = e.ts + (e.dur or 0.0)  # type: ignore[operator]
                    self.steps.append((int(number[:18]), e.ts, end, e.pid, e.tid))  # type: ignore[arg-type]
                    if e.args is not None and e.args.rank is not None:
                        self.step_ranks.setdefault(e.pid, set()).add(e.args.rank)
                else:
                    kept.append(e)
            group = kept
        pids.extend(self._threads([e.pid for e in group]))
        tids.extend(self._threads([e.tid for e in group]))
        starts.extend([e.ts for e in group])
        ends.extend([e.ts + (e.dur or 0.0) for e in group])  # type: ignore[operator]
        names.extend(self._names(group))
        flags.extend([annotation] * len(group))

    def _check_times(self) -> None:
        """Every start and end finite and within MAX_TIME (:func:`check_times`)."""
        import numpy as np

        def names(index: int) -> str:  # only when an event is refused: names may be many
            return next(itertools.islice(self.names, index, None))

        for what, lists, at in (
            ("a device event", self.dev, (3, 4, 6)),
            ("a runtime call", self.rt, (2, 3, 5)),
            ("a host op", self.op, (2, 3, 4)),
        ):
            if lists[0]:
                start, end, name = (lists[i] for i in at)
                check_times(what, np.asarray(start), np.asarray(end), name, names)

    def flush(self) -> None:
        """Move the Python lists into numpy chunks: 30-40 bytes an event instead of ~200."""
        import numpy as np

        self._check_times()
        self.memory.flush()
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
        if self.steps or self.gpu_step_starts:  # checked once: they are kept as Python lists
            starts = [s[1] for s in self.steps] + [t for _, t in self.gpu_step_starts]
            ends = [s[2] for s in self.steps] + [t for _, t in self.gpu_step_starts]
            check_times("a step", np.asarray(starts), np.asarray(ends), None, str)

        def joined(chunks: list[list[Any]], types: tuple[Any, ...]) -> list[Any]:
            out = []
            for chunk, dtype in zip(chunks, types, strict=True):
                out.append(np.concatenate(chunk) if chunk else np.empty(0, dtype=dtype))
                chunk.clear()  # one field's chunks at a time: peak = columns + one field
            return out

        memory = self.memory.columns()
        if memory.skipped:
            self.dropped[BAD_MEMORY_EVENT] += memory.skipped
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
            step_ranks={self.thread_id(pid): ranks for pid, ranks in self.step_ranks.items()},
            gpu_step_starts=self.gpu_step_starts,
            header=header,
            memory=memory,
            categories=self.categories,
            unknown_categories=self.unknown,
            events=self.events,
            used=self.used + memory.size,
            skipped=self.skipped,
            dropped=self.dropped,
            missing_duration=self.missing_duration,
            missing_timestamp=self.missing_timestamp,
        )
        return cols


def normalise_time(columns: Columns) -> None:
    """Nanosecond timestamps (some exporters write them) become microseconds."""
    import numpy as np

    unit = str(columns.header.get("displayTimeUnit", "")).lower()
    starts = [
        a for a in (columns.dev_ts, columns.rt_ts, columns.op_ts, columns.memory.ts) if a.size
    ]
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
        columns.memory.ts = columns.memory.ts * scale
        columns.steps = [
            (num, start * scale, end * scale, pid, tid)
            for num, start, end, pid, tid in columns.steps
        ]
        columns.gpu_step_starts = [(n, t * scale) for n, t in columns.gpu_step_starts]
