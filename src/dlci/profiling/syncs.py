"""Host calls that wait for the device, and the ops (``.item()``, ``nonzero``...) behind them."""

from __future__ import annotations

from typing import Any

import numpy as np

from dlci.profiling.columns import Columns
from dlci.profiling.names import BLOCKING_OPS, BLOCKING_SYNC, NameMasks
from dlci.profiling.timeline import Window
from dlci.profiling.units import us
from dlci.report.fields import SyncCall, Syncs


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


MAX_SYNCS_ATTRIBUTED = 200_000  # calls attributed to an op one by one; the rest only counted


def syncs(
    cols: Columns,
    names: NameMasks,
    host_pid: int | None,
    windows: list[Window],
) -> Syncs:
    """Host calls that block until the device catches up, and the op that made them."""
    mask = names.mask(cols.rt_name, BLOCKING_SYNC)
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
        blocking = [n for n in enclosing if BLOCKING_OPS.match(n)]
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
    ordered = [
        SyncCall(**{**row, "wait_us": us(row["wait_us"]), "max_wait_us": us(row["max_wait_us"])})
        for row in sorted(rows.values(), key=lambda r: -r["wait_us"])
    ]
    blocking_ops = _outermost(cols, names.mask(cols.op_name, BLOCKING_OPS) & ~cols.op_annotation)
    steps = max(len(windows), 1)
    return Syncs(
        count=int(idx.size),
        wait_us=us(total_wait),
        per_step=round(idx.size / steps, 3),
        blocking_ops=int(blocking_ops.sum()),
        blocking_ops_per_step=round(int(blocking_ops.sum()) / steps, 3),
        by_call=ordered,
    )


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
