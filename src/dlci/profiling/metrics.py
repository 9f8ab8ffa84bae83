"""Utilization metrics from a trace's columns, each with the definition its anchor uses.

Every number here is documented, with its exact definition, in docs/profiling.md; the JSON
report (schema_version 1) is the dict that :func:`analyze` returns. Times are microseconds
(``*_us``), shares are percentages (``*_pct``, 0-100).
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from dlci.profiling import intervals as iv
from dlci.profiling.reader import KERNEL, MEMCPY, MEMSET, SYNC, Columns

SCHEMA_VERSION = 1
TINY_KERNEL_US = 10.0
TOP_GAPS = 10
DATA_LOADING_WARN_PCT = 5.0

_NCCL = re.compile(r"nccl|rccl", re.IGNORECASE)
_LAUNCH = re.compile(r"^(cuda|hip|cu)(Ext)?(Module)?Launch(Kernel|CooperativeKernel)")
_ASYNC_WORK = re.compile(r"^(cuda|hip)Mem(cpy|set)[A-Za-z0-9]*Async")
_GRAPH_LAUNCH = re.compile(r"^(cuda|hip)GraphLaunch")
_BLOCKING_SYNC = re.compile(
    r"^(cuda|hip)(DeviceSynchronize|StreamSynchronize|EventSynchronize|Memcpy|MemcpyDtoH)$|"
    r"^cu(Ctx|Stream|Event)Synchronize$"
)
_BLOCKING_OPS = re.compile(
    r"^aten::(item|_local_scalar_dense|nonzero|masked_select|unique|_unique2|is_nonzero|"
    r"tolist|equal|allclose|repeat_interleave)$"
)
DATA_PATTERNS = (re.compile(r"^enumerate\(DataLoader\)"), re.compile(r"^dlci/data$"))
PHASES = {
    "data_loading": DATA_PATTERNS,
    "optimizer": (
        re.compile(r"^dlci/optimizer$"),
        re.compile(r"^Optimizer\.(step|zero_grad)#"),
        re.compile(r"^## optimizer ##$"),
    ),
    "backward": (
        re.compile(r"^dlci/backward$"),
        re.compile(r"^autograd::engine::evaluate_function"),
        re.compile(r"^## backward ##$"),
    ),
    "forward": (re.compile(r"^dlci/forward$"), re.compile(r"^## forward ##$")),
}


class _Names:
    """Boolean masks over interned names, computed once per pattern."""

    def __init__(self, names: list[str]) -> None:
        self.names = names
        self._cache: dict[Any, Any] = {}

    def mask(self, ids: Any, *patterns: re.Pattern[str]) -> Any:
        key = patterns
        table = self._cache.get(key)
        if table is None:
            table = np.fromiter(
                (any(p.search(n) for p in patterns) for n in self.names),
                dtype=bool,
                count=len(self.names),
            )
            self._cache[key] = table
        if not len(table):
            return np.zeros(len(ids), dtype=bool)
        return table[ids]

    def contains(self, ids: Any, text: str) -> Any:
        return self.mask(ids, re.compile(re.escape(text)))


def _pct(part: float, whole: float) -> float:
    return round(float(100.0 * part / whole), 4) if whole > 0 else 0.0


def _us(value: float) -> float:
    return round(float(value), 3)


def _stats(values: Any) -> dict[str, float]:
    if not len(values):
        return {"count": 0, "mean_us": 0.0, "median_us": 0.0, "p95_us": 0.0}
    return {
        "count": len(values),
        "mean_us": _us(np.mean(values)),
        "median_us": _us(np.median(values)),
        "p95_us": _us(np.percentile(values, 95)),
    }


def analyze(cols: Columns, *, source: str = "") -> dict[str, Any]:
    """The utilization report of one trace."""
    names = _Names(cols.names)
    warnings: list[str] = []
    devices = sorted(int(d) for d in np.unique(cols.dev_device)) if cols.dev_device.size else []

    # -- the profiled steps
    steps = cols.steps
    host_pid = steps[0][3] if steps else None
    if not steps:
        warnings.append(
            "no ProfilerStep#N markers: the trace was recorded without a schedule, so "
            "per-step numbers are missing and the whole trace is one window"
        )
    if not devices:
        warnings.append(
            "CPU-only trace: it holds no kernels, copies or sets on a GPU, so GPU utilization "
            "and the device metrics are not available"
        )
    if cols.missing_duration:
        warnings.append(
            f"{cols.missing_duration} events have no duration: device events without one are "
            "left out, host events count as instants"
        )
    if cols.missing_timestamp:
        warnings.append(f"{cols.missing_timestamp} events have no timestamp and were skipped")
    if cols.unknown_categories:
        listed = ", ".join(f"{c} ({n})" for c, n in cols.unknown_categories.most_common(5))
        warnings.append(f"events of unknown categories were ignored: {listed}")
    if cols.time_scale != 1.0:
        warnings.append("timestamps were in nanoseconds; they were converted to microseconds")

    launch_of = _launch_times(cols)
    host_ops = _host_ops(cols, host_pid)
    windows = _step_windows(cols, steps, launch_of)
    window = (windows[0][1], windows[-1][2]) if windows else _whole_span(cols)

    report: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "kind": "utilization",
        "trace": {
            "path": source,
            "size_bytes": cols.size_bytes,
            "compressed": cols.compressed,
            "events": cols.events,
            "categories": dict(cols.categories.most_common()),
            "cpu_only": not devices,
            "device_names": _device_names(cols.header),
            "window_us": _us(window[1] - window[0]),
        },
        "steps": {
            "count": len(windows),
            "numbers": [w[0] for w in windows],
            "mean_step_us": _us(np.mean([w[2] - w[1] for w in windows])) if windows else 0.0,
        },
    }

    # -- per device
    device_reports = []
    for device in devices:
        device_reports.append(_device_report(cols, names, device, window, launch_of))
    report["devices"] = device_reports
    primary = max(device_reports, key=lambda d: d["busy"]["busy_us"], default=None)
    report["primary_device"] = primary["device"] if primary else None
    report["gpu_utilization_pct"] = primary["gpu_utilization_pct"] if primary else None

    # -- per step: breakdown and phases
    report["per_step"] = _per_step(cols, names, windows, host_ops, primary, launch_of)
    report["breakdown"] = _sum_over_steps(report["per_step"], "breakdown", "duration_us")
    report["phases"] = _sum_over_steps(report["per_step"], "phases", "host_duration_us")

    report["syncs"] = _syncs(cols, names, host_pid, windows)
    report["launches"] = _launches(cols, names, launch_of, primary)
    if np.any(names.mask(cols.rt_name, _GRAPH_LAUNCH)):
        warnings.append(
            "the trace holds CUDA graph launches: kernels replayed by a graph have no launch "
            "of their own, so launch overhead and step attribution cover only the rest"
        )
    _last_step_warning(cols, names, windows, warnings)
    report["warnings"] = warnings
    report["recommendations"] = _recommendations(report)
    return report


# ---------------------------------------------------------------------------- building blocks


def _device_names(header: dict[str, Any]) -> dict[str, str]:
    props = header.get("deviceProperties")
    out: dict[str, str] = {}
    if isinstance(props, list):
        for p in props:
            if isinstance(p, dict) and "id" in p and isinstance(p.get("name"), str):
                out[str(p["id"])] = p["name"]
    return out


def _whole_span(cols: Columns) -> tuple[float, float]:
    starts = [a.min() for a in (cols.dev_ts, cols.rt_ts, cols.op_ts) if a.size]
    ends = [a.max() for a in (cols.dev_end, cols.rt_end, cols.op_end) if a.size]
    if not starts:
        return (0.0, 0.0)
    return (float(min(starts)), float(max(ends)))


def _launch_times(cols: Columns) -> Any:
    """For each device event, the start of the host call that launched it (NaN if unknown)."""
    out = np.full(cols.dev_corr.size, np.nan)
    if not cols.dev_corr.size or not cols.rt_corr.size:
        return out
    valid = cols.rt_corr >= 0
    corr, ts = cols.rt_corr[valid], cols.rt_ts[valid]
    order = np.argsort(corr, kind="stable")
    corr, ts = corr[order], ts[order]
    pos = np.searchsorted(corr, cols.dev_corr)
    pos = np.clip(pos, 0, max(corr.size - 1, 0))
    found = (cols.dev_corr >= 0) & (corr.size > 0)
    if corr.size:
        found &= corr[pos] == cols.dev_corr
        out[found] = ts[pos[found]]
    return out


def _host_ops(cols: Columns, host_pid: int | None) -> Any:
    if host_pid is None:
        return np.ones(cols.op_pid.size, dtype=bool)
    return cols.op_pid == host_pid


def _step_windows(
    cols: Columns, steps: list[tuple[int, float, float, int, int]], launch_of: Any
) -> list[tuple[int, float, float, float]]:
    """(number, start, end, cpu_end) per step, TensorBoard's way.

    A step's end moves to the end of the device work its host side launched; the next step
    starts no earlier than that end, so steps never overlap.
    """
    if not steps:
        return []
    starts = np.array([s[1] for s in steps])
    cpu_ends = np.array([s[2] for s in steps])
    gpu_end = np.full(len(steps), -np.inf)
    known = ~np.isnan(launch_of)
    if known.any():
        idx = np.searchsorted(starts, launch_of[known], side="right") - 1
        ok = (idx >= 0) & (launch_of[known] < cpu_ends[np.clip(idx, 0, None)])
        np.maximum.at(gpu_end, idx[ok], cols.dev_end[known][ok])
    out = []
    previous_end = -np.inf
    for i, (number, start, cpu_end, _pid, _tid) in enumerate(steps):
        begin = max(start, previous_end)
        end = max(cpu_end, gpu_end[i], begin)
        out.append((number, float(begin), float(end), float(cpu_end)))
        previous_end = end
    return out


def _device_report(
    cols: Columns,
    names: _Names,
    device: int,
    window: tuple[float, float],
    launch_of: Any,
) -> dict[str, Any]:
    on = cols.dev_device == device
    kind = cols.dev_kind[on]
    ts, end = cols.dev_ts[on], cols.dev_end[on]
    name_ids = cols.dev_name[on]
    nccl = names.mask(name_ids, _NCCL)
    is_kernel = kind == KERNEL
    kernels = iv.merge(ts[is_kernel], end[is_kernel])
    copies_sets = (kind == MEMCPY) | (kind == MEMSET)
    busy_set = iv.merge(ts[is_kernel | copies_sets], end[is_kernel | copies_sets])

    # TensorBoard: kernels within the steps' span.
    lo, hi = window
    util = iv.length(*iv.clip(*kernels, lo, hi))

    # TraceLens: kernels, memcpy and memset over the first-to-last device event.
    first = float(ts.min()) if ts.size else 0.0
    last = float(end.max()) if end.size else 0.0
    span = last - first

    temporal = _hta_temporal_breakdown(cols, on, launch_of)

    idle_gaps = _gaps(cols, device, busy_set, window, launch_of)
    copies = _copies(cols, names, on, kernels)

    report = {
        "device": device,
        "name": _device_names(cols.header).get(str(device)),
        "gpu_utilization_pct": _pct(util, hi - lo),
        "gpu_utilization": {
            "definition": "tensorboard",
            "kernel_us": _us(util),
            "window_us": _us(hi - lo),
        },
        "busy": {
            "definition": "tracelens",
            "busy_us": _us(iv.length(*busy_set)),
            "span_us": _us(span),
            "busy_pct": _pct(iv.length(*busy_set), span),
        },
        "temporal_breakdown": temporal,
        "kernels": {
            "count": int(is_kernel.sum()),
            "time_us": _us(np.sum(end[is_kernel] - ts[is_kernel])),
            "communication_count": int((is_kernel & nccl).sum()),
            "sync_events": int((kind == SYNC).sum()),
        },
        "idle_gaps": idle_gaps,
        "copies": copies,
    }
    return report


# HTA 0.5's kernel typing, by name only (hta/utils/utils.py): "computation" is whatever does
# not match this, quirks included (a name containing Memcpy or Sync, or starting with Memset).
_HTA_NOT_COMPUTE = re.compile(r"(^nccl.*Kernel)|(.*(Memcpy)|(Memset))|(.*Sync)")


def _hta_temporal_breakdown(cols: Columns, on: Any, launch_of: Any) -> dict[str, Any]:
    """Holistic Trace Analysis's temporal breakdown, with its default rules (docs/profiling.md).

    As HTA 0.5 does it: the last ProfilerStep's device work is left out when the trace has
    two or more steps (by the start of the host call that launched it); times are rounded to
    whole microseconds (starts up, ends down) when the trace has fractional timestamps; the
    span runs from the first to the last device event; compute is the union of events whose
    names HTA types as computation; non-compute = span - compute - idle.
    """
    keep = on.copy()
    step_names = {f"ProfilerStep#{s[0]}" for s in cols.steps}
    step_names |= {n for n, _ in cols.gpu_step_starts}
    dropped_last = False
    if len(step_names) >= 2:
        last_start = max([s[1] for s in cols.steps] + [t for _, t in cols.gpu_step_starts])
        with np.errstate(invalid="ignore"):
            launched_before = launch_of < last_start  # NaN (no launch found) -> dropped
        keep &= launched_before
        dropped_last = True
    ts, end = cols.dev_ts[keep], cols.dev_end[keep]
    rounded = _fractional(cols)
    if rounded:
        ts, end = np.ceil(ts), np.floor(end)
    by_name = np.fromiter(
        (_HTA_NOT_COMPUTE.match(n) is None for n in cols.names), dtype=bool, count=len(cols.names)
    )
    compute = by_name[cols.dev_name[keep]] if by_name.size else np.zeros(0, dtype=bool)
    union = iv.merge(ts, end)
    busy = iv.length(*union)
    span = float(union[1][-1] - union[0][0]) if len(union[0]) else 0.0
    compute_len = iv.length(*iv.merge(ts[compute], end[compute]))
    idle = span - busy
    return {
        "definition": "hta",
        "last_step_dropped": dropped_last,
        "rounded_to_whole_us": rounded,
        "events": int(keep.sum()),
        "span_us": _us(span),
        "idle_us": _us(idle),
        "compute_us": _us(compute_len),
        "non_compute_us": _us(span - compute_len - idle),
        "idle_pct": _pct(idle, span),
        "compute_pct": _pct(compute_len, span),
        "non_compute_pct": _pct(span - compute_len - idle, span),
    }


def _fractional(cols: Columns) -> bool:
    """Whether any timestamp has a fraction (HTA then rounds every event to whole us)."""
    if cols.missing_timestamp:
        return True
    for arr in (cols.dev_ts, cols.rt_ts, cols.op_ts):
        if arr.size and bool(np.any(arr != np.floor(arr))):
            return True
    return any(s[1] != int(s[1]) for s in cols.steps)


def _op_during(cols: Columns, lo: float, hi: float) -> dict[str, Any] | None:
    """The host op that overlaps ``[lo, hi]`` the most (the innermost on a tie)."""
    cand = (cols.op_ts < hi) & (cols.op_end > lo)
    if not cand.any():
        return None
    idx = np.flatnonzero(cand)
    over = np.minimum(cols.op_end[idx], hi) - np.maximum(cols.op_ts[idx], lo)
    dur = cols.op_end[idx] - cols.op_ts[idx]
    best = idx[np.lexsort((dur, -over))[0]]
    return {
        "name": cols.names[cols.op_name[best]],
        "overlap_us": _us(min(cols.op_end[best], hi) - max(cols.op_ts[best], lo)),
    }


def _gaps(
    cols: Columns, device: int, busy: iv.Pair, window: tuple[float, float], launch_of: Any
) -> list[dict[str, Any]]:
    lo, hi = window
    gs, ge = iv.gaps(*busy, lo, hi)
    if not gs.size:
        return []
    order = np.argsort(-(ge - gs), kind="stable")[:TOP_GAPS]
    on = cols.dev_device == device
    dev_ts = cols.dev_ts[on]
    launch_order = np.argsort(dev_ts, kind="stable")
    sorted_ts = dev_ts[launch_order]
    launches = launch_of[on][launch_order]
    out = []
    for i in order:
        g0, g1 = float(gs[i]), float(ge[i])
        nxt = int(np.searchsorted(sorted_ts, g1, side="left"))
        cause = "end of window"
        next_launch = None
        if nxt < sorted_ts.size:
            launch = launches[nxt]
            if np.isnan(launch):
                cause = "unknown"
            else:
                next_launch = float(launch)
                cause = "host" if launch >= g0 else "device"
        out.append(
            {
                "start_us": _us(g0 - lo),
                "duration_us": _us(g1 - g0),
                "cause": cause,
                "next_launch_us": _us(next_launch - lo) if next_launch is not None else None,
                "cpu_op": _op_during(cols, g0, g1),
            }
        )
    return out


def _copies(cols: Columns, names: _Names, on: Any, kernels: iv.Pair) -> dict[str, Any]:
    kind = cols.dev_kind[on]
    is_copy = kind == MEMCPY
    ids = cols.dev_name[on]
    out: dict[str, Any] = {}
    h2d = is_copy & names.contains(ids, "HtoD")
    for label, mask in (
        ("h2d_pageable", h2d & names.contains(ids, "Pageable")),
        ("h2d_pinned", h2d & names.contains(ids, "Pinned")),
        ("h2d_other", h2d & ~names.contains(ids, "Pageable") & ~names.contains(ids, "Pinned")),
        ("d2h", is_copy & names.contains(ids, "DtoH")),
        ("d2d", is_copy & names.contains(ids, "DtoD")),
    ):
        ts, end = cols.dev_ts[on][mask], cols.dev_end[on][mask]
        size = int(cols.dev_bytes[on][mask].sum())
        time = float(np.sum(end - ts))
        merged = iv.merge(ts, end)
        exposed = iv.length(*merged) - iv.overlap(merged, kernels)
        out[label] = {
            "count": int(mask.sum()),
            "bytes": size,
            "time_us": _us(time),
            "bandwidth_gbps": round(size / time / 1e3, 3) if time > 0 else 0.0,
            "exposed_us": _us(exposed),
        }
    return out


def _per_step(
    cols: Columns,
    names: _Names,
    windows: list[tuple[int, float, float, float]],
    host: Any,
    primary: dict[str, Any] | None,
    launch_of: Any,
) -> list[dict[str, Any]]:
    if not windows:
        return []
    if primary is not None:
        on = cols.dev_device == primary["device"]
    else:
        on = np.zeros(cols.dev_kind.size, dtype=bool)
    kind = cols.dev_kind
    nccl = names.mask(cols.dev_name, _NCCL)
    sets = {
        "kernel_us": iv.merge(
            cols.dev_ts[on & (kind == KERNEL) & ~nccl], cols.dev_end[on & (kind == KERNEL) & ~nccl]
        ),
        "memcpy_us": iv.merge(
            cols.dev_ts[on & (kind == MEMCPY)], cols.dev_end[on & (kind == MEMCPY)]
        ),
        "memset_us": iv.merge(
            cols.dev_ts[on & (kind == MEMSET)], cols.dev_end[on & (kind == MEMSET)]
        ),
        "communication_us": iv.merge(
            cols.dev_ts[on & (kind == KERNEL) & nccl], cols.dev_end[on & (kind == KERNEL) & nccl]
        ),
    }
    sets["runtime_us"] = iv.merge(cols.rt_ts, cols.rt_end)
    data_mask = host & names.mask(cols.op_name, *DATA_PATTERNS)
    sets["data_loading_us"] = iv.merge(cols.op_ts[data_mask], cols.op_end[data_mask])
    cpu_mask = host & ~cols.op_annotation
    sets["cpu_exec_us"] = iv.merge(cols.op_ts[cpu_mask], cols.op_end[cpu_mask])
    ordered = list(sets.items())

    phase_sets = []
    for phase, patterns in PHASES.items():
        mask = host & names.mask(cols.op_name, *patterns)
        phase_sets.append((f"{phase}_us", iv.merge(cols.op_ts[mask], cols.op_end[mask])))

    numbers = [w[0] for w in windows]
    lo = np.array([w[1] for w in windows])
    hi = np.array([w[2] for w in windows])
    cpu_hi = np.array([w[3] for w in windows])
    breakdown = iv.priority_lengths(lo, hi, ordered)
    breakdown["other_us"] = breakdown.pop("other")
    phases = iv.priority_lengths(lo, np.maximum(cpu_hi, lo), phase_sets)
    phases["other_us"] = phases.pop("other")
    kernel_time = iv.clipped_lengths(*sets["kernel_us"], lo, hi)
    out = []
    for i, number in enumerate(numbers):
        out.append(
            {
                "step": number,
                "start_us": _us(lo[i] - lo[0]),
                "duration_us": _us(hi[i] - lo[i]),
                "host_duration_us": _us(max(cpu_hi[i] - lo[i], 0.0)),
                "gpu_utilization_pct": _pct(kernel_time[i], hi[i] - lo[i]) if primary else None,
                "breakdown": {k: _us(v[i]) for k, v in breakdown.items()},
                "phases": {k: _us(v[i]) for k, v in phases.items()},
            }
        )
    return out


def _sum_over_steps(per_step: list[dict[str, Any]], part: str, total_key: str) -> dict[str, Any]:
    """Sum one split (``breakdown`` or ``phases``) over the steps, with shares of the total."""
    if not per_step:
        return {}
    total = sum(s[total_key] for s in per_step)
    sums = {k: sum(s[part][k] for s in per_step) for k in per_step[0][part]}
    return {
        "total_us": _us(total),
        **{k: _us(v) for k, v in sums.items()},
        "pct": {k.removesuffix("_us"): _pct(v, total) for k, v in sums.items()},
    }


class _OpIndex:
    """Host ops (not annotations) sorted by thread and start, to find the ops around an instant.

    Ops on one thread nest, so the ops enclosing a call start before it, among the last few
    hundred ops that start before it on its thread.
    """

    WINDOW = 512

    def __init__(self, cols: Columns) -> None:
        keep = np.flatnonzero(~cols.op_annotation)
        order = keep[np.lexsort((cols.op_ts[keep], cols.op_tid[keep], cols.op_pid[keep]))]
        self.names = cols.names
        self.pid, self.tid = cols.op_pid[order], cols.op_tid[order]
        self.ts, self.end, self.name = cols.op_ts[order], cols.op_end[order], cols.op_name[order]
        self.ranges: dict[tuple[int, int], tuple[int, int]] = {}
        if order.size:
            change = np.flatnonzero((np.diff(self.pid) != 0) | (np.diff(self.tid) != 0)) + 1
            starts = np.concatenate(([0], change))
            ends = np.concatenate((change, [order.size]))
            for lo, hi in zip(starts.tolist(), ends.tolist(), strict=True):
                self.ranges[(int(self.pid[lo]), int(self.tid[lo]))] = (lo, hi)

    def enclosing(self, pid: int, tid: int, ts: float, end: float) -> list[str]:
        """Names of the ops on the thread that contain ``[ts, end]``, outermost first."""
        found = self.ranges.get((pid, tid))
        if found is None:
            return []
        lo, hi = found
        j = lo + int(np.searchsorted(self.ts[lo:hi], ts, side="right"))
        first = max(lo, j - self.WINDOW)
        inside = np.flatnonzero(self.end[first:j] >= end) + first
        return [self.names[k] for k in self.name[inside].tolist()]


MAX_SYNCS_ATTRIBUTED = 200_000


def _syncs(
    cols: Columns,
    names: _Names,
    host_pid: int | None,
    windows: list[tuple[int, float, float, float]],
) -> dict[str, Any]:
    """Host calls that block until the device catches up, and the op that made them."""
    mask = names.mask(cols.rt_name, _BLOCKING_SYNC)
    idx = np.flatnonzero(mask)
    waits = cols.rt_end[idx] - cols.rt_ts[idx]
    total_wait = float(waits.sum())
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    index = _OpIndex(cols) if idx.size else None
    for i, wait in zip(
        idx[:MAX_SYNCS_ATTRIBUTED].tolist(), waits[:MAX_SYNCS_ATTRIBUTED].tolist(), strict=True
    ):
        pid, tid = int(cols.rt_pid[i]), int(cols.rt_tid[i])
        enclosing = index.enclosing(pid, tid, float(cols.rt_ts[i]), float(cols.rt_end[i]))  # type: ignore[union-attr]
        blocking = [n for n in enclosing if _BLOCKING_OPS.match(n)]
        caller = blocking[0] if blocking else (enclosing[0] if enclosing else "(no op)")
        key = (cols.names[cols.rt_name[i]], caller)
        row = rows.get(key)
        if row is None:
            row = rows[key] = {
                "call": key[0],
                "caller": key[1],
                "count": 0,
                "wait_us": 0.0,
                "max_wait_us": 0.0,
            }
        row["count"] += 1
        row["wait_us"] += wait
        if wait > row["max_wait_us"]:
            row["max_wait_us"] = wait
    ordered = sorted(rows.values(), key=lambda r: -r["wait_us"])
    for row in ordered:
        row["wait_us"] = _us(row["wait_us"])
        row["max_wait_us"] = _us(row["max_wait_us"])
    blocking_ops = _outermost(cols, names.mask(cols.op_name, _BLOCKING_OPS) & ~cols.op_annotation)
    steps = max(len(windows), 1)
    return {
        "count": int(idx.size),
        "wait_us": _us(total_wait),
        "per_step": round(idx.size / steps, 3),
        "blocking_ops": int(blocking_ops.sum()),
        "blocking_ops_per_step": round(int(blocking_ops.sum()) / steps, 3),
        "by_call": ordered,
    }


def _outermost(cols: Columns, mask: Any) -> Any:
    """``mask`` less the ops nested inside another masked op on the same thread.

    ``.item()`` records aten::item around aten::_local_scalar_dense: one read, not two.
    """
    idx = np.flatnonzero(mask)
    if idx.size < 2:
        return mask
    order = np.lexsort((cols.op_ts[idx], cols.op_tid[idx], cols.op_pid[idx]))
    idx = idx[order]
    out = mask.copy()
    last_key, reach = None, -np.inf
    for i in idx:
        key = (cols.op_pid[i], cols.op_tid[i])
        if key != last_key:
            last_key, reach = key, -np.inf
        if cols.op_end[i] <= reach:
            out[i] = False
        else:
            reach = cols.op_end[i]
    return out


def _launches(
    cols: Columns, names: _Names, launch_of: Any, primary: dict[str, Any] | None
) -> dict[str, Any]:
    launch_mask = names.mask(cols.rt_name, _LAUNCH)
    cost = cols.rt_end[launch_mask] - cols.rt_ts[launch_mask]
    is_kernel = cols.dev_kind == KERNEL
    if primary is not None:
        is_kernel &= cols.dev_device == primary["device"]
    durations = cols.dev_end[is_kernel] - cols.dev_ts[is_kernel]
    delays = (cols.dev_ts - launch_of)[is_kernel]
    delays = delays[~np.isnan(delays)]
    tiny = durations < TINY_KERNEL_US
    return {
        "launch_calls": _stats(cost),
        "launch_delay": _stats(delays),
        "tiny_kernel_threshold_us": TINY_KERNEL_US,
        "tiny_kernels": int(tiny.sum()),
        "tiny_kernels_pct": _pct(float(tiny.sum()), float(durations.size)),
        "tiny_kernel_time_pct": _pct(float(durations[tiny].sum()), float(durations.sum())),
        "launch_bound_kernels": int(np.sum(durations < np.median(cost))) if cost.size else 0,
    }


def _last_step_warning(
    cols: Columns,
    names: _Names,
    windows: list[tuple[int, float, float, float]],
    warnings: list[str],
) -> None:
    """Launches in the last step whose device work is missing mean the trace ends early."""
    if not windows or not cols.rt_corr.size:
        return
    start, cpu_end = windows[-1][1], windows[-1][3]
    # Only calls that always make device work: kernel launches, async copies and sets.
    launchy = names.mask(cols.rt_name, _LAUNCH, _ASYNC_WORK) & (cols.rt_corr >= 0)
    in_last = (cols.rt_ts >= start) & (cols.rt_ts < cpu_end) & launchy
    if not in_last.any():
        return
    device_corr = np.sort(cols.dev_corr[cols.dev_corr >= 0])
    if not device_corr.size:
        return
    rows = np.flatnonzero(launchy & (cols.rt_ts < cpu_end))
    corr = cols.rt_corr[rows]
    pos = np.clip(np.searchsorted(device_corr, corr), 0, device_corr.size - 1)
    missing = device_corr[pos] != corr
    in_last_rows = cols.rt_ts[rows] >= start
    missing_launches = int((missing & in_last_rows).sum())
    lost_before = int((missing & ~in_last_rows).sum())
    if missing_launches and missing_launches > lost_before:
        warnings.append(
            f"the last step (ProfilerStep#{windows[-1][0]}) was cut short: "
            f"{missing_launches} of its launches have no device event, so its numbers "
            "undercount the device work"
        )


def _recommendations(report: dict[str, Any]) -> list[dict[str, str]]:
    recs: list[dict[str, str]] = []
    phases = report.get("phases", {}).get("pct", {})
    data_pct = phases.get("data_loading", 0.0)
    if data_pct > DATA_LOADING_WARN_PCT:
        recs.append(
            {
                "id": "data-loading",
                "finding": f"data loading takes {data_pct:.1f}% of host step time "
                f"(above {DATA_LOADING_WARN_PCT:g}%)",
                "advice": "raise DataLoader num_workers, set pin_memory=True and "
                "persistent_workers=True, and move decoding and augmentation off the main process",
            }
        )
    syncs = report.get("syncs", {})
    if syncs.get("blocking_ops_per_step", 0) >= 1 and report.get("devices"):
        recs.append(
            {
                "id": "syncs",
                "finding": f"{syncs['blocking_ops_per_step']:g} blocking device-to-host reads "
                f"per step (.item(), .tolist(), nonzero...), {syncs['wait_us'] / 1e3:.2f} ms "
                "of host waiting in all",
                "advice": "remove .item() and other device-to-host reads from the training "
                "loop: accumulate losses on the GPU and read them every N steps",
            }
        )
    util = report.get("gpu_utilization_pct")
    launches = report.get("launches", {})
    if util is not None and util < 50.0 and launches.get("tiny_kernels_pct", 0.0) > 50.0:
        recs.append(
            {
                "id": "tiny-kernels",
                "finding": f"GPU utilization {util:.1f}% with {launches['tiny_kernels_pct']:.0f}% "
                f"of kernels shorter than {TINY_KERNEL_US:g} us: launch-bound",
                "advice": "use a larger batch, fuse small ops (torch.compile), or capture the "
                "step in a CUDA graph",
            }
        )
    for device in report.get("devices", []):
        pageable = device["copies"]["h2d_pageable"]
        if pageable["count"]:
            recs.append(
                {
                    "id": "pageable-copies",
                    "finding": f"GPU {device['device']}: {pageable['count']} host-to-device "
                    f"copies from pageable memory ({pageable['bytes'] / 2**20:.1f} MiB, "
                    f"{pageable['exposed_us'] / 1e3:.2f} ms not hidden by compute)",
                    "advice": "pin the host memory (DataLoader(pin_memory=True)) and copy with "
                    ".to(device, non_blocking=True)",
                }
            )
            break
    return recs
