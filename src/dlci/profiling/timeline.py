"""When the profiled steps are, and which host call launched each device event."""

from __future__ import annotations

from typing import Any

import numpy as np

from dlci.profiling.columns import Columns

Window = tuple[int, float, float, float]  # (step number, start, end, end of its host side)


def device_names(header: dict[str, Any]) -> dict[str, str]:
    """GPU names by device id, from the trace's ``deviceProperties``."""
    props = header.get("deviceProperties")
    out: dict[str, str] = {}
    if isinstance(props, list):
        for p in props:
            if isinstance(p, dict) and "id" in p and isinstance(p.get("name"), str):
                out[str(p["id"])] = p["name"]
    return out


def whole_span(cols: Columns) -> tuple[float, float]:
    """From the first event's start to the last one's end (the window without steps)."""
    starts = [a.min() for a in (cols.dev_ts, cols.rt_ts, cols.op_ts) if a.size]
    ends = [a.max() for a in (cols.dev_end, cols.rt_end, cols.op_end) if a.size]
    if not starts:
        return (0.0, 0.0)
    return (float(min(starts)), float(max(ends)))


def launch_rows(cols: Columns) -> Any:
    """For each device event, the index of the host call that launched it (through
    ``args.correlation``), or -1 when the trace holds none."""
    out = np.full(cols.dev_corr.size, -1, dtype=np.int64)
    if not cols.dev_corr.size or not cols.rt_corr.size:
        return out
    rows = np.flatnonzero(cols.rt_corr >= 0)
    if not rows.size:
        return out
    order = rows[np.argsort(cols.rt_corr[rows], kind="stable")]
    corr = cols.rt_corr[order]
    pos = np.clip(np.searchsorted(corr, cols.dev_corr), 0, corr.size - 1)
    found = (cols.dev_corr >= 0) & (corr[pos] == cols.dev_corr)
    out[found] = order[pos[found]]
    return out


def launch_times(cols: Columns, rows: Any = None) -> Any:
    """For each device event, the start of the host call that launched it (NaN if unknown)."""
    rows = launch_rows(cols) if rows is None else rows
    out = np.full(rows.size, np.nan)
    found = rows >= 0
    out[found] = cols.rt_ts[rows[found]]
    return out


def host_ops(cols: Columns, host_pid: int | None) -> Any:
    """The host ops of the training process (all of them when no step names it)."""
    if host_pid is None:
        return np.ones(cols.op_pid.size, dtype=bool)
    return cols.op_pid == host_pid


def step_windows(
    cols: Columns, steps: list[tuple[int, float, float, int, int]], launch_of: Any
) -> list[Window]:
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
