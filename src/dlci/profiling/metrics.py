"""The utilization report of one trace, assembled from the metric families.

Every number is documented, with its exact definition, in docs/profiling.md; the JSON
report (schema_version 1) is the :class:`~dlci.report.fields.Utilization` that :func:`analyze`
returns. Times are microseconds
(``*_us``), shares are percentages (``*_pct``, 0-100). Each family lives in its own module:
:mod:`~dlci.profiling.busy` (per GPU), :mod:`~dlci.profiling.steps` (breakdown and phases),
:mod:`~dlci.profiling.syncs`, :mod:`~dlci.profiling.launches`,
:mod:`~dlci.profiling.memory` and :mod:`~dlci.profiling.advice` (recommendations).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
from msgspec import UNSET

from dlci.profiling.advice import recommendations
from dlci.profiling.busy import device_report
from dlci.profiling.columns import Columns
from dlci.profiling.launches import last_step_warning, launches
from dlci.profiling.memory import memory_section
from dlci.profiling.names import GRAPH_LAUNCH, NameMasks
from dlci.profiling.processes import merged_report, shared_process, step_processes
from dlci.profiling.readstate import (
    CPU_ONLY,
    NOT_UNDERSTOOD,
    read_section,
    state_warnings,
    trace_state,
)
from dlci.profiling.steps import per_step, sum_over_steps
from dlci.profiling.syncs import syncs
from dlci.profiling.timeline import (
    device_names,
    host_ops,
    launch_rows,
    launch_times,
    step_windows,
    whole_span,
)
from dlci.profiling.units import us
from dlci.report.fields import Steps, Trace, Utilization

SCHEMA_VERSION = 1


def analyze(cols: Columns, *, source: str = "") -> Utilization:
    """The utilization report of one trace; a trace whose ProfilerStep markers come from
    several processes (a merged multi-rank trace) gets one report per process under
    ``processes`` and no steps of its own (:mod:`dlci.profiling.processes`)."""
    shared = shared_process(cols)
    if shared is not None:
        return analyze_one(dataclasses.replace(cols, steps=[]), source=source, refused=shared)
    pids = step_processes(cols)
    if len(pids) > 1:
        return merged_report(cols, pids, source, analyze_one)
    return analyze_one(cols, source=source)


def analyze_one(
    cols: Columns, *, source: str = "", refused: str | None = None, rows: Any = None
) -> Utilization:
    """The report of a trace whose steps (if any) are one process's; ``refused``: why the
    trace's step markers were set aside (the whole trace is then one window); ``rows``:
    the launch of each device event (:func:`~dlci.profiling.timeline.launch_rows`)."""
    names = NameMasks(cols.names)
    devices = sorted(set(cols.dev_device.tolist()))  # not np.unique: it imports numpy.ma
    state = trace_state(cols, names, devices)
    warnings = _trace_warnings(cols, refused, state) + state_warnings(cols, names, state)
    host_pid = cols.steps[0][3] if cols.steps else None
    launch_of = launch_times(cols, launch_rows(cols) if rows is None else rows)
    windows = step_windows(cols, cols.steps, launch_of)
    window = (windows[0][1], windows[-1][2]) if windows else whole_span(cols)

    device_reports = [device_report(cols, names, d, window, launch_of) for d in devices]
    primary = max(device_reports, key=lambda d: d.busy.busy_us, default=None)
    steps = per_step(cols, names, windows, host_ops(cols, host_pid), primary)
    report = Utilization(
        schema_version=SCHEMA_VERSION,
        kind="utilization",
        trace=_trace_section(cols, source, state, window, read_section(cols, names, windows)),
        steps=Steps(
            count=len(windows),
            numbers=[w[0] for w in windows],
            mean_step_us=us(np.mean([w[2] - w[1] for w in windows])) if windows else 0.0,
            refused=refused or UNSET,
        ),
        devices=device_reports,
        primary_device=primary.device if primary else None,
        gpu_utilization_pct=primary.gpu_utilization_pct if primary else None,
        per_step=steps,
        breakdown=sum_over_steps(steps, "breakdown", "duration_us"),
        phases=sum_over_steps(steps, "phases", "host_duration_us"),
        syncs=syncs(cols, names, host_pid, windows),
        launches=launches(cols, names, launch_of, primary),
        memory=memory_section(cols),
        warnings=warnings,
    )
    if np.any(names.mask(cols.rt_name, GRAPH_LAUNCH)):
        warnings.append(
            "the trace holds CUDA graph launches: kernels replayed by a graph have no launch "
            "of their own, so launch overhead and step attribution cover only the rest"
        )
    last_step_warning(cols, names, windows, warnings)
    report.recommendations = recommendations(report)
    return report


def _trace_section(
    cols: Columns, source: str, state: str, window: tuple[float, float], read: Any
) -> Trace:
    """The report's head: what the trace holds, and what the reader did with its events."""
    return Trace(
        path=source,
        size_bytes=cols.size_bytes,
        compressed=cols.compressed,
        events=cols.events,
        categories=dict(cols.categories.most_common()),
        state=state,
        cpu_only=state == CPU_ONLY,
        understood=state != NOT_UNDERSTOOD,
        device_names=device_names(cols.header),
        # written into the trace by dlci profile (torch.profiler's add_metadata); a diff of
        # runs on two torch versions is flagged as not comparable
        torch_version=_text(cols.header.get("dlci_torch_version")),
        window_us=us(window[1] - window[0]),
        read=read,
    )


def _text(value: object) -> str | None:
    """A short string from the trace's header, or None."""
    return value[:64] if isinstance(value, str) else None


def _trace_warnings(cols: Columns, refused: str | None, state: str) -> list[str]:
    """What the trace lacks or holds oddly, which limits what its numbers mean."""
    warnings: list[str] = []
    if refused:
        warnings.append(refused)
    elif not cols.steps and state != NOT_UNDERSTOOD:
        warnings.append(
            "no ProfilerStep#N markers: the trace was recorded without a schedule, so "
            "per-step numbers are missing and the whole trace is one window"
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
    return warnings
