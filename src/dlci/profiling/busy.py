"""How busy each GPU is: utilization (TensorBoard), busy time (TraceLens) and the temporal
breakdown (Holistic Trace Analysis), with the device's idle gaps and copies."""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from dlci.profiling import intervals as iv
from dlci.profiling.columns import KERNEL, MEMCPY, MEMSET, SYNC, Columns
from dlci.profiling.copies import copies
from dlci.profiling.gaps import idle_gaps
from dlci.profiling.names import NCCL, NameMasks
from dlci.profiling.timeline import device_names
from dlci.profiling.units import pct, us
from dlci.report.fields import Busy, Device, GpuUtilization, Kernels, Temporal


def device_report(
    cols: Columns,
    names: NameMasks,
    device: int,
    window: tuple[float, float],
    launch_of: Any,
) -> Device:
    """Everything the report says about one GPU (``devices[]`` in docs/profiling.md)."""
    on = cols.dev_device == device
    kind = cols.dev_kind[on]
    ts, end = cols.dev_ts[on], cols.dev_end[on]
    name_ids = cols.dev_name[on]
    nccl = names.mask(name_ids, NCCL)
    is_kernel = kind == KERNEL
    kernels = iv.merge(ts[is_kernel], end[is_kernel])
    copies_sets = (kind == MEMCPY) | (kind == MEMSET)
    busy_set = iv.merge(ts[is_kernel | copies_sets], end[is_kernel | copies_sets])

    # TensorBoard: kernels within the steps' span.
    lo, hi = window
    util = iv.length(*iv.clip(*kernels, lo, hi))

    # TraceLens: kernels, memcpy and memset over the first-to-last of them (not cuda_sync:
    # TraceLens's span is over its busy events only)
    busy_ts, busy_end = ts[is_kernel | copies_sets], end[is_kernel | copies_sets]
    first = float(busy_ts.min()) if busy_ts.size else 0.0
    last = float(busy_end.max()) if busy_end.size else 0.0
    span = last - first

    temporal = _hta_temporal_breakdown(cols, on, launch_of)

    gaps = idle_gaps(cols, device, busy_set, window, launch_of)
    device_copies = copies(cols, names, on, kernels)

    return Device(
        device=device,
        name=device_names(cols.header).get(str(device)),
        gpu_utilization_pct=pct(util, hi - lo),
        gpu_utilization=GpuUtilization(
            definition="tensorboard", kernel_us=us(util), window_us=us(hi - lo)
        ),
        busy=Busy(
            definition="tracelens",
            busy_us=us(iv.length(*busy_set)),
            span_us=us(span),
            busy_pct=pct(iv.length(*busy_set), span),
        ),
        temporal_breakdown=temporal,
        kernels=Kernels(
            count=int(is_kernel.sum()),
            time_us=us(np.sum(end[is_kernel] - ts[is_kernel])),
            communication_count=int((is_kernel & nccl).sum()),
            sync_events=int((kind == SYNC).sum()),
        ),
        idle_gaps=gaps,
        copies=device_copies,
    )


# HTA 0.5's kernel typing, by name only (hta/utils/utils.py): "computation" is whatever does
# not match this, quirks included (a name containing Memcpy or Sync, or starting with Memset).
_HTA_NOT_COMPUTE = re.compile(r"(^nccl.*Kernel)|(.*(Memcpy)|(Memset))|(.*Sync)")


def _hta_temporal_breakdown(cols: Columns, on: Any, launch_of: Any) -> Temporal:
    """Holistic Trace Analysis's temporal breakdown, with its default rules (docs/profiling.md).

    As HTA 0.5 does it: the device events on a stream (a sync event with stream -1, waiting on
    an event or the whole context, is left out); the last ProfilerStep's device work is left out
    when the trace has two or more steps (by the start of the host call that launched it); times
    are rounded to whole microseconds (starts up, ends down) when the trace has fractional
    timestamps; the span runs from the first to the last device event; compute is the union of
    events whose names HTA types as computation; non-compute = span - compute - idle.
    """
    keep = on & (cols.dev_stream != -1)  # HTA: events on a stream (not Event/Context Sync)
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
    return Temporal(
        definition="hta",
        last_step_dropped=dropped_last,
        rounded_to_whole_us=rounded,
        events=int(keep.sum()),
        span_us=us(span),
        idle_us=us(idle),
        compute_us=us(compute_len),
        non_compute_us=us(span - compute_len - idle),
        idle_pct=pct(idle, span),
        compute_pct=pct(compute_len, span),
        non_compute_pct=pct(span - compute_len - idle, span),
    )


def _fractional(cols: Columns) -> bool:
    """Whether any timestamp has a fraction (HTA then rounds every event to whole us)."""
    if cols.missing_timestamp:
        return True
    for arr in (cols.dev_ts, cols.rt_ts, cols.op_ts):
        if arr.size and bool(np.any(arr != np.floor(arr))):
            return True
    return any(s[1] != int(s[1]) for s in cols.steps)
