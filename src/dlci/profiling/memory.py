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

from collections import defaultdict
from typing import Any

import numpy as np

from dlci.profiling import intervals as iv
from dlci.profiling.columns import Columns
from dlci.profiling.memcols import CPU, CUDA, MemoryColumns, device_label
from dlci.profiling.names import NameMasks
from dlci.profiling.steps import phase_sets
from dlci.profiling.timeline import host_ops

TOP = 10  # operators listed in top_allocations
NO_OPERATOR = "(no operator)"
MAX_DEPTH = 1000  # enclosing ops walked up per allocation before giving up
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


def memory_section(cols: Columns) -> dict[str, Any]:
    """Section E of the utilization report, from the trace's [memory] events."""
    mem = cols.memory
    if not mem.size:
        why = "the trace holds no [memory] events, so there are no memory figures"
        if mem.skipped:
            why = f"none of the trace's {mem.skipped} [memory] events could be read"
        return _section("none", f"{why}; {HOW_TO_RECORD}.")
    kind, index, others = _device(mem)
    on = (mem.device_type == kind) & (mem.device_id == index)
    series, notes = _series(mem, on, kind)
    # on the host's timeline, where allocations happen: from a step's start on the host to
    # its end there (TensorBoard's windows, moved to the end of the device work, overlap the
    # next step's host side)
    ranges = [(s[0], s[1], s[2]) for s in cols.steps] or [(-1, -np.inf, np.inf)]
    section = _section("trace", None, device=device_label(kind, index))
    section.update(_peaks(cols, series, ranges))
    total = _device_total(cols.header, index) if kind == CUDA else None
    section["device_total_bytes"] = total
    peak = section["peak_reserved_bytes"] or section["peak_allocated_bytes"]
    if total and peak is not None:
        section["peak_percent_of_device"] = round(100.0 * peak / total, 4)
    lo, hi = ranges[0][1], ranges[-1][2]
    section["top_allocations"] = top_allocations(cols, mem, on, lo, hi)
    if kind == CPU:
        notes.append(
            "on the CPU, torch counts only the blocks allocated while memory profiling was on, "
            "so the figures leave out what the process held before"
        )
    if others:
        notes.append(
            f"figures for {section['device']}; the trace also holds memory events of "
            + ", ".join(others)
        )
    if mem.skipped:
        notes.append(
            f"{mem.skipped} [memory] events with missing, odd or out-of-range fields were skipped"
        )
    section["note"] = "; ".join(notes) + "." if notes else None
    return section


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
    reserved[reserved < 0] = np.nan
    if kind == CPU:
        reserved[:] = np.nan  # torch's CPU allocator reserves nothing: it reports 0
    return (ts, allocated, reserved), notes


def _peaks(
    cols: Columns, series: tuple[Any, Any, Any], ranges: list[tuple[int, float, float]]
) -> dict[str, Any]:
    """The per-step peaks and the highest of them, with its phase."""
    host = host_ops(cols, cols.steps[0][3] if cols.steps else None)
    phases = phase_sets(cols, NameMasks(cols.names), host)
    found = [_step(*series, phases, r) for r in ranges]
    steps = [s for s in found if s is not None]
    if not steps:
        return {}
    top = max(steps, key=lambda s: s["peak_allocated_bytes"])
    known = [s["peak_reserved_bytes"] for s in steps if s["peak_reserved_bytes"] is not None]
    return {
        "peak_allocated_bytes": top["peak_allocated_bytes"],
        "peak_reserved_bytes": max(known) if known else None,
        "peak_phase": top["peak_phase"],
        "steps": steps if cols.steps else [],
    }


def _section(source: str, note: str | None, device: str | None = None) -> dict[str, Any]:
    return {
        "source": source,
        "note": note,
        "device": device,
        "device_total_bytes": None,
        "peak_allocated_bytes": None,
        "peak_reserved_bytes": None,
        "peak_percent_of_device": None,
        "peak_phase": None,
        "steps": [],
        "top_allocations": [],
        "capture": None,
        "batch_estimate": None,
    }


def _device(mem: MemoryColumns) -> tuple[int, int, list[str]]:
    """The device the figures are for: the accelerator with the highest allocated total
    (CPU only when there is none), and the labels of the other devices seen."""
    pairs = sorted(set(zip(mem.device_type.tolist(), mem.device_id.tolist(), strict=True)))
    accelerators = [p for p in pairs if p[0] != CPU] or pairs

    def highest(pair: tuple[int, int]) -> int:
        on = (mem.device_type == pair[0]) & (mem.device_id == pair[1])
        return int(np.max(np.maximum(mem.allocated[on], 0)))

    kind, index = max(accelerators, key=highest)
    others = [device_label(*p) for p in pairs if p != (kind, index)]
    return kind, index, others


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
        if isinstance(p, dict) and p.get("id") == index:
            total = p.get("totalGlobalMem")
            if type(total) is int and 0 < total < 2**63:
                return total
    return None


def top_allocations(
    cols: Columns, mem: MemoryColumns, on: Any, lo: float, hi: float
) -> list[dict[str, Any]]:
    """Bytes allocated (events with positive ``Bytes``) in ``[lo, hi)`` by the innermost
    host op around each allocation on its thread, largest first."""
    keep = on & (mem.bytes > 0) & (mem.ts >= lo) & (mem.ts < hi)
    owners = enclosing_ops(cols, mem.pid[keep], mem.tid[keep], mem.ts[keep])
    sums: dict[int, list[int]] = defaultdict(lambda: [0, 0])
    for owner, size in zip(owners.tolist(), mem.bytes[keep].tolist(), strict=True):
        row = sums[owner]
        row[0] += size
        row[1] += 1
    rows = sorted(sums.items(), key=lambda item: (-item[1][0], -item[1][1]))[:TOP]
    return [
        {
            "operator": cols.names[owner] if owner >= 0 else NO_OPERATOR,
            "bytes": size,
            "count": count,
        }
        for owner, (size, count) in rows
    ]


def enclosing_ops(cols: Columns, pids: Any, tids: Any, ts: Any) -> Any:
    """For each instant, the name id of the innermost host op (not an annotation) on the
    same thread that covers it (the one that started last), or -1."""
    out = np.full(ts.size, -1, dtype=np.int64)
    ops = ~cols.op_annotation
    for pid, tid in set(zip(pids.tolist(), tids.tolist(), strict=True)):
        mine = ops & (cols.op_pid == pid) & (cols.op_tid == tid)
        if not mine.any():
            continue
        order = np.lexsort((-cols.op_end[mine], cols.op_ts[mine]))
        starts, ends = cols.op_ts[mine][order], cols.op_end[mine][order]
        names = cols.op_name[mine][order]
        parent = _parents(starts.tolist(), ends.tolist())
        here = np.flatnonzero((pids == pid) & (tids == tid))
        at = np.searchsorted(starts, ts[here], side="right") - 1
        for _ in range(MAX_DEPTH):  # walk up to the first op that still runs at the instant
            ended = (at >= 0) & (ends[np.maximum(at, 0)] < ts[here])
            if not ended.any():
                break
            at[ended] = parent[at[ended]]
        ok = (at >= 0) & (ends[np.maximum(at, 0)] >= ts[here])
        out[here[ok]] = names[at[ok]]
    return out


def _parents(starts: list[float], ends: list[float]) -> Any:
    """For ops sorted by start (longest first on a tie), the index of the op each one
    nests in (-1 for none).

    >>> _parents([0.0, 1.0, 2.0, 5.0], [10.0, 4.0, 3.0, 6.0]).tolist()
    [-1, 0, 1, 0]
    """
    parent = np.full(len(starts), -1, dtype=np.int64)
    stack: list[int] = []
    for i, start in enumerate(starts):
        while stack and ends[stack[-1]] < start:
            stack.pop()
        if stack:
            parent[i] = stack[-1]
        stack.append(i)
    return parent
