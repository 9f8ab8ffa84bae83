"""The utilization report's ``memory`` section, from a trace's ``[memory]`` events.

Every allocation and free that torch.profiler records with ``profile_memory=True`` carries
the allocator's totals just after it (:mod:`dlci.profiling.memcols`), so the peak of a step
is the largest ``Total Allocated`` (and ``Total Reserved``) among its events and the level
it started with. The peak's phase is the phase (data loading, forward, backward, optimizer:
the annotations :mod:`~dlci.profiling.steps` splits host time by) running at the instant of
the event that reached it; each allocation goes to the innermost host op around it on the
same thread. Every key is documented in docs/profiling.md ("Memory").
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dlci.profiling import intervals as iv
from dlci.profiling.columns import Columns
from dlci.profiling.memcols import CPU, CUDA, MAX_BYTES, MemoryColumns, device_label
from dlci.profiling.names import NameMasks
from dlci.profiling.steps import phase_sets
from dlci.profiling.timeline import host_ops
from dlci.report.fields import Memory

TOP = 10  # operators listed in top_allocations
NO_OPERATOR = "(no operator)"
MAX_DEPTH = 1000  # enclosing ops walked up per allocation before giving up
MAX_OTHERS = 5  # other devices named in the note
PHASE_NAMES = {
    "data_loading_us": "data",
    "forward_us": "forward",
    "backward_us": "backward",
    "optimizer_us": "optimizer",
}
HOW_TO_RECORD = (
    "record them with torch.profiler.profile(profile_memory=True); dlci profile records "
    "them in a short pass of its own (trace-memory.json.gz)"
)


def memory_section(cols: Columns) -> Memory:
    """Section E of the utilization report, from the trace's [memory] events."""
    mem = cols.memory
    if not mem.size:
        why = "the trace holds no [memory] events, so there are no memory figures"
        if mem.skipped:
            why = f"none of the trace's {mem.skipped} [memory] events could be read"
        return blank_section("none", f"{why}; {HOW_TO_RECORD}.")
    kind, index, others = _device(mem)
    on = (mem.device_type == kind) & (mem.device_id == index)
    series, notes = _series(mem, on, kind)
    # on the host's timeline, where allocations happen: from a step's start on the host to
    # its end there (TensorBoard's windows, moved to the end of the device work, overlap the
    # next step's host side)
    ranges = [(s[0], s[1], s[2]) for s in cols.steps] or [(-1, -np.inf, np.inf)]
    section = blank_section("trace", None, device=device_label(kind, index))
    _peaks(section, cols, series, ranges)
    if not cols.steps:
        notes.append(
            "the trace has no ProfilerStep markers: the peak is over the whole trace, and "
            "there are no per-step figures"
        )
    if section.peak_allocated_bytes is None:
        notes.append(
            f"none of the {int(np.count_nonzero(on))} [memory] events of {section.device} "
            "comes before the end of a profiled step with a readable 'Total Allocated', so "
            "there are no peak figures"
        )
    if kind == CUDA:
        notes += _add_device_total(section, cols.header, index)
    lo, hi = ranges[0][1], ranges[-1][2]
    section.top_allocations = top_allocations(cols, mem, on, lo, hi)
    if kind == CPU:
        notes.append(
            "on the CPU, torch counts only the blocks allocated while memory profiling was on, "
            "so the figures leave out what the process held before"
        )
    if others:
        shown = ", ".join(others[:MAX_OTHERS])
        more = f" and {len(others) - MAX_OTHERS:,} more" if len(others) > MAX_OTHERS else ""
        notes.append(
            f"figures for {section.device}; the trace also holds memory events of {shown}{more}"
        )
    if mem.skipped:
        notes.append(
            f"{mem.skipped} [memory] events with missing, odd or out-of-range fields were skipped"
        )
    section.note = "; ".join(notes) + "." if notes else None
    return section


def _add_device_total(section: Memory, header: dict[str, Any], index: int) -> list[str]:
    """The GPU's total and the peak's share of it; a note instead of a total that is missing,
    unreadable, or below the trace's own peak (a bogus ``totalGlobalMem``)."""
    total = _device_total(header, index)
    peak = section.peak_reserved_bytes or section.peak_allocated_bytes
    where = f"totalGlobalMem of the trace's deviceProperties for {section.device}"
    if total is None:
        return [f"no usable {where}, so no percentage of the device"]
    if peak is not None and peak > total:
        return [
            f"the {where} ({total:,} bytes) is below the trace's own peak ({peak:,} bytes): "
            "not a credible total, so no percentage of the device"
        ]
    section.device_total_bytes = total
    if peak is not None:
        section.peak_percent_of_device = round(100.0 * peak / total, 4)
    return []


def _series(mem: MemoryColumns, on: Any, kind: int) -> tuple[tuple[Any, Any, Any], list[str]]:
    """(ts, allocated, reserved) of the device's events in time order (reserved NaN where
    unknown), and what the figures' reader should know about them."""
    order = np.argsort(mem.ts[on], kind="stable")
    ts = mem.ts[on][order]
    allocated = mem.allocated[on][order]
    reserved = mem.reserved[on][order].astype(np.float64)
    notes = []
    if (allocated < 0).all():
        allocated = np.maximum(np.cumsum(mem.bytes[on][order]), 0)
        notes.append(
            "the events carry no 'Total Allocated': the allocated figures are the running sum "
            "of their 'Bytes' from the first event, a lower bound"
        )
    else:  # events without a readable total count for the top allocations only
        has = allocated >= 0
        ts, allocated, reserved = ts[has], allocated[has], reserved[has]
        if not has.all():
            notes.append(
                f"{has.size - int(np.count_nonzero(has))} [memory] events without a readable "
                "'Total Allocated' are left out of the peaks (not out of top_allocations)"
            )
    reserved[reserved < 0] = np.nan
    if kind == CPU:
        reserved[:] = np.nan  # torch's CPU allocator reserves nothing: it reports 0
    return (ts, allocated, reserved), notes


def _peaks(
    section: Memory,
    cols: Columns,
    series: tuple[Any, Any, Any],
    ranges: list[tuple[int, float, float]],
) -> None:
    """The per-step peaks and the highest of them, with its phase, into ``section``."""
    host = host_ops(cols, cols.steps[0][3] if cols.steps else None)
    phases = phase_sets(cols, NameMasks(cols.names), host)
    found = [_step(*series, phases, r) for r in ranges]
    steps = [s for s in found if s is not None]
    if not steps:
        return
    top = max(steps, key=lambda s: s["peak_allocated_bytes"])
    known = [s["peak_reserved_bytes"] for s in steps if s["peak_reserved_bytes"] is not None]
    section.peak_allocated_bytes = top["peak_allocated_bytes"]
    section.peak_reserved_bytes = max(known) if known else None
    section.peak_phase = top["peak_phase"]
    section.steps = steps if cols.steps else []


def blank_section(source: str, note: str | None, device: str | None = None) -> Memory:
    """A memory section with no figures yet (report["memory"], docs/profiling.md)."""
    return Memory(source=source, note=note, device=device)


def _device(mem: MemoryColumns) -> tuple[int, int, list[str]]:
    """The device the figures are for: the accelerator with the highest allocated total
    (CPU only when there is none), and the labels of the other devices seen. One pass over
    the events, however many devices a hostile trace names."""
    # one int64 per device, in (type, id) order: types < 2**15, ids from -1 to 2**31
    key = (mem.device_type.astype(np.int64) << 32) + (mem.device_id.astype(np.int64) + 1)
    seen, which = np.unique(key, return_inverse=True)
    highest = np.zeros(seen.size, dtype=np.int64)
    np.maximum.at(highest, which.reshape(-1), np.maximum(mem.allocated, 0))
    kinds, ids = seen >> 32, (seen & 0xFFFFFFFF) - 1
    candidates = np.flatnonzero(kinds != CPU)
    if not candidates.size:
        candidates = np.arange(seen.size)
    best = int(candidates[np.argmax(highest[candidates])])  # the first (lowest) on a tie
    others = [
        device_label(int(t), int(i))
        for j, (t, i) in enumerate(zip(kinds.tolist(), ids.tolist(), strict=True))
        if j != best
    ]
    return int(kinds[best]), int(ids[best]), others


def _step(
    ts: Any,
    allocated: Any,
    reserved: Any,
    phases: list[tuple[str, iv.Pair]],
    r: tuple[int, float, float],
) -> dict[str, Any] | None:
    """One step's peaks: among its events and the level it began with (the last event
    before it); None when no event came before its end."""
    number, lo, hi = r
    first = int(np.searchsorted(ts, lo, side="left"))
    end = int(np.searchsorted(ts, hi, side="left"))
    begin = max(first - 1, 0)
    if end <= begin:
        return None
    at = begin + int(np.argmax(allocated[begin:end]))
    window = reserved[begin:end]
    peak_reserved = None if np.isnan(window).all() else int(np.nanmax(window))
    return {
        "step": number,
        "peak_allocated_bytes": int(allocated[at]),
        "peak_reserved_bytes": peak_reserved,
        "peak_phase": phase_at(phases, float(ts[at])),
    }


def phase_at(phases: list[tuple[str, iv.Pair]], t: float) -> str:
    """The phase running at instant ``t`` (the first set that covers it), else "other".

    >>> import numpy as np
    >>> sets = [("data_loading_us", (np.array([0.0]), np.array([5.0]))),
    ...         ("forward_us", (np.array([5.0]), np.array([9.0])))]
    >>> phase_at(sets, 2.0), phase_at(sets, 7.0), phase_at(sets, 12.0)
    ('data', 'forward', 'other')
    """
    for name, (starts, ends) in phases:
        j = int(np.searchsorted(starts, t, side="right")) - 1
        if j >= 0 and t <= ends[j]:
            return PHASE_NAMES.get(name, "other")
    return "other"


def _device_total(header: dict[str, Any], index: int) -> int | None:
    """The GPU's memory from the trace's ``deviceProperties`` (``totalGlobalMem``)."""
    props = header.get("deviceProperties")
    for p in props if isinstance(props, list) else []:
        if isinstance(p, dict) and type(p.get("id")) is int and p["id"] == index:  # not True
            total = p.get("totalGlobalMem")
            if type(total) is int and 0 < total <= MAX_BYTES:
                return total
    return None


def top_allocations(
    cols: Columns, mem: MemoryColumns, on: Any, lo: float, hi: float
) -> list[dict[str, Any]]:
    """Bytes allocated (events with positive ``Bytes``) in ``[lo, hi)`` by the innermost
    host op around each allocation on its thread, largest first."""
    keep = on & (mem.bytes > 0) & (mem.ts >= lo) & (mem.ts < hi)
    owners = enclosing_ops(cols, mem.pid[keep], mem.tid[keep], mem.ts[keep])
    names, which = np.unique(owners, return_inverse=True)
    which = which.reshape(-1)
    total = _sum_by(which, mem.bytes[keep], names.size)
    counts = np.bincount(which, minlength=names.size).tolist()
    rows = sorted(
        zip(names.tolist(), zip(total, counts, strict=True), strict=True),
        key=lambda item: (-item[1][0], -item[1][1]),
    )[:TOP]
    return [
        {
            "operator": cols.names[owner] if owner >= 0 else NO_OPERATOR,
            "bytes": size,
            "count": count,
        }
        for owner, (size, count) in rows
    ]


def _sum_by(group: Any, values: Any, groups: int) -> list[int]:
    """Exact sums of non-negative int64 ``values`` by ``group``, as Python integers: split in
    25-bit halves, since sums of values up to 2**50 can overflow 64 bits.

    >>> _sum_by(np.array([0, 1, 0]), np.array([2**50, 3, 2**50]), 2)
    [2251799813685248, 3]
    """
    low, high = np.zeros(groups, dtype=np.int64), np.zeros(groups, dtype=np.int64)
    np.add.at(low, group, values & ((1 << 25) - 1))
    np.add.at(high, group, values >> 25)
    return [(h << 25) + lo for h, lo in zip(high.tolist(), low.tolist(), strict=True)]


def enclosing_ops(cols: Columns, pids: Any, tids: Any, ts: Any) -> Any:
    """For each instant, the name id of the innermost host op (not an annotation) on the
    same thread that covers it (the one that started last), or -1. Sorted once over every
    thread together: the time grows with the events, not with events times threads."""
    out = np.full(ts.size, -1, dtype=np.int64)
    ops = np.flatnonzero(~cols.op_annotation)
    if not ts.size or not ops.size:
        return out
    thread = _thread_ids(
        np.concatenate([cols.op_pid[ops], pids]), np.concatenate([cols.op_tid[ops], tids])
    )
    op_thread, at_thread = thread[: ops.size], thread[ops.size :]
    mine = np.isin(op_thread, at_thread)
    ops, op_thread = ops[mine], op_thread[mine]
    if not ops.size:  # no op runs on any thread that allocated
        return out
    order = np.lexsort((-cols.op_end[ops], cols.op_ts[ops], op_thread))
    ops, op_thread = ops[order], op_thread[order]
    starts, ends, names = cols.op_ts[ops], cols.op_end[ops], cols.op_name[ops]
    parent = _parents(starts.tolist(), ends.tolist(), op_thread.tolist())
    at = _last_started(op_thread, starts, at_thread, ts)
    todo = np.flatnonzero((at >= 0) & (ends[np.maximum(at, 0)] < ts))
    for _ in range(MAX_DEPTH):  # walk up to the first op that still runs at the instant
        if not todo.size:
            break
        at[todo] = parent[at[todo]]
        todo = todo[(at[todo] >= 0) & (ends[np.maximum(at[todo], 0)] < ts[todo])]
    ok = (at >= 0) & (ends[np.maximum(at, 0)] >= ts)
    out[ok] = names[at[ok]]
    return out


def _thread_ids(pids: Any, tids: Any) -> Any:
    """One small integer per (pid, tid) pair, by 1-D sorts only (a sort of pairs is slow).

    >>> _thread_ids(np.array([7, 7, 9, 7]), np.array([1, 2, 1, 1])).tolist()
    [0, 1, 2, 0]
    """
    pid = np.unique(pids, return_inverse=True)[1].reshape(-1).astype(np.int64)
    tid_values, tid = np.unique(tids, return_inverse=True)
    key = pid * tid_values.size + tid.reshape(-1)
    return np.unique(key, return_inverse=True)[1].reshape(-1)


def _last_started(op_thread: Any, starts: Any, at_thread: Any, ts: Any) -> Any:
    """For each instant, the index of the last op (ops sorted by thread, then start) on its
    thread that started at or before it, or -1.

    >>> import numpy as np
    >>> _last_started(np.array([0, 0, 1]), np.array([1.0, 5.0, 2.0]),
    ...               np.array([0, 0, 1, 1, 2]), np.array([6.0, 0.5, 2.0, 1.0, 9.0])).tolist()
    [1, -1, 2, -1, -1]
    """
    n = starts.size
    index = np.concatenate([np.arange(n), np.full(ts.size, -1)])
    is_instant = np.concatenate([np.zeros(n, dtype=np.int8), np.ones(ts.size, dtype=np.int8)])
    when = np.concatenate([starts, ts])
    merged = np.lexsort(
        (np.arange(index.size), is_instant, when, np.concatenate([op_thread, at_thread]))
    )
    latest = np.maximum.accumulate(index[merged])  # ops come in their sorted order
    found = np.empty(ts.size, dtype=np.int64)
    found[merged[merged >= n] - n] = latest[merged >= n]
    same = (found >= 0) & (op_thread[np.maximum(found, 0)] == at_thread)
    return np.where(same, found, -1)


def _parents(starts: list[float], ends: list[float], threads: list[int] | None = None) -> Any:
    """For ops sorted by thread, then start (longest first on a tie), the index of the op
    each one nests in on its thread (-1 for none).

    >>> _parents([0.0, 1.0, 2.0, 5.0], [10.0, 4.0, 3.0, 6.0]).tolist()
    [-1, 0, 1, 0]
    >>> _parents([0.0, 1.0], [10.0, 4.0], [0, 1]).tolist()
    [-1, -1]
    """
    parent = np.full(len(starts), -1, dtype=np.int64)
    stack: list[int] = []
    for i, start in enumerate(starts):
        if threads is not None and stack and threads[stack[-1]] != threads[i]:
            stack.clear()
        while stack and ends[stack[-1]] < start:
            stack.pop()
        if stack:
            parent[i] = stack[-1]
        stack.append(i)
    return parent
