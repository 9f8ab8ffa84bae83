"""Host-to-device, device-to-host and device-to-device copies: bytes, bandwidth, exposed time."""

from __future__ import annotations

from typing import Any

import numpy as np

from dlci.profiling import intervals as iv
from dlci.profiling.columns import MEMCPY, Columns
from dlci.profiling.names import NameMasks
from dlci.profiling.units import us
from dlci.report.fields import Copies, CopyStats


def copies(cols: Columns, names: NameMasks, on: Any, kernels: iv.Pair) -> Copies:
    kind = cols.dev_kind[on]
    is_copy = kind == MEMCPY
    ids = cols.dev_name[on]
    out: dict[str, CopyStats] = {}
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
        out[label] = CopyStats(
            count=int(mask.sum()),
            bytes=size,
            time_us=us(time),
            bandwidth_gbps=round(size / time / 1e3, 3) if time > 0 else 0.0,
            exposed_us=us(exposed),
        )
    return Copies(**out)
