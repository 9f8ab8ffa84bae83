"""Kernel launch overhead, tiny kernels, and a last step cut short by the end of the trace."""

from __future__ import annotations

from typing import Any

import numpy as np

from dlci.profiling.columns import KERNEL, Columns
from dlci.profiling.names import ASYNC_WORK, LAUNCH, NameMasks
from dlci.profiling.timeline import Window
from dlci.profiling.units import pct, percentile, stats
from dlci.report.fields import Device, Launches

TINY_KERNEL_US = 10.0


def launches(cols: Columns, names: NameMasks, launch_of: Any, primary: Device | None) -> Launches:
    launch_mask = names.mask(cols.rt_name, LAUNCH)
    cost = cols.rt_end[launch_mask] - cols.rt_ts[launch_mask]
    is_kernel = cols.dev_kind == KERNEL
    if primary is not None:
        is_kernel &= cols.dev_device == primary.device
    durations = cols.dev_end[is_kernel] - cols.dev_ts[is_kernel]
    delays = (cols.dev_ts - launch_of)[is_kernel]
    delays = delays[~np.isnan(delays)]
    tiny = durations < TINY_KERNEL_US
    return Launches(
        launch_calls=stats(cost),
        launch_delay=stats(delays),
        tiny_kernel_threshold_us=TINY_KERNEL_US,
        tiny_kernels=int(tiny.sum()),
        tiny_kernels_pct=pct(float(tiny.sum()), float(durations.size)),
        tiny_kernel_time_pct=pct(float(durations[tiny].sum()), float(durations.sum())),
        launch_bound_kernels=int(np.sum(durations < percentile(cost, 50))) if cost.size else 0,
    )


def last_step_warning(
    cols: Columns,
    names: NameMasks,
    windows: list[Window],
    warnings: list[str],
) -> None:
    """Launches in the last step whose device work is missing mean the trace ends early."""
    if not windows or not cols.rt_corr.size:
        return
    start, cpu_end = windows[-1][1], windows[-1][3]
    # Only calls that always make device work: kernel launches, async copies and sets.
    launchy = names.mask(cols.rt_name, LAUNCH, ASYNC_WORK) & (cols.rt_corr >= 0)
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
