"""When each GPU sits idle within the steps, and whether the host or the device made it wait."""

from __future__ import annotations

from typing import Any

import numpy as np

from dlci.profiling import intervals as iv
from dlci.profiling.columns import Columns
from dlci.profiling.units import us
from dlci.report.fields import CpuOp, IdleGap

TOP_GAPS = 10


def op_during(cols: Columns, lo: float, hi: float) -> CpuOp | None:
    """The host op that overlaps ``[lo, hi]`` the most (the innermost on a tie)."""
    cand = (cols.op_ts < hi) & (cols.op_end > lo)
    if not cand.any():
        return None
    idx = np.flatnonzero(cand)
    over = np.minimum(cols.op_end[idx], hi) - np.maximum(cols.op_ts[idx], lo)
    dur = cols.op_end[idx] - cols.op_ts[idx]
    best = idx[np.lexsort((dur, -over))[0]]
    return CpuOp(
        name=cols.names[cols.op_name[best]],
        overlap_us=us(min(cols.op_end[best], hi) - max(cols.op_ts[best], lo)),
    )


def idle_gaps(
    cols: Columns, device: int, busy: iv.Pair, window: tuple[float, float], launch_of: Any
) -> list[IdleGap]:
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
            IdleGap(
                start_us=us(g0 - lo),
                duration_us=us(g1 - g0),
                cause=cause,
                next_launch_us=us(next_launch - lo) if next_launch is not None else None,
                cpu_op=op_during(cols, g0, g1),
            )
        )
    return out
