"""What the reader made of a trace: its events counted by fate, and the trace's state.

Every event of the file is one of: used (read into the figures), skipped (a kind the figures
never need: metadata, counters, flow arrows, instant marks, Python frames, GPU-side copies of
annotations, profiler overhead), or dropped for a reason (no category, a phase not handled,
an unknown category, no timestamp, no duration, not an object, an unreadable [memory]
event). The counts come from the reader (:class:`~dlci.profiling.columns.ColumnBuilder`),
kept as it folds each slice, so counting costs no pass of its own.

The state says what kind of trace it is, so that a trace is called CPU-only only when it is:

- ``gpu``: it holds device events (kernels, copies, sets, syncs);
- ``cpu-only``: no device events and no kernel launch or copy on the host side;
- ``gpu activity not recorded``: no device events, but the host launched kernels or copies
  (the profiler ran without CUDA activity, or CUPTI could not start);
- ``not understood``: most of its events were dropped (more than were used), or none was
  used: a legacy autograd-profiler export, a rocprof or Nsight export, something else.
"""

from __future__ import annotations

import numpy as np

from dlci.profiling.columns import DROP_REASONS, Columns
from dlci.profiling.names import COPY_CALL, GRAPH_LAUNCH, LAUNCH, NameMasks
from dlci.profiling.timeline import Window
from dlci.report.fields import ReadCounts

GPU = "gpu"
CPU_ONLY = "cpu-only"
NOT_RECORDED = "gpu activity not recorded"
NOT_UNDERSTOOD = "not understood"
STATES = (GPU, CPU_ONLY, NOT_RECORDED, NOT_UNDERSTOOD)


def host_calls(cols: Columns, names: NameMasks) -> tuple[int, int]:
    """Kernel launches (graph launches too) and copies or sets made by the host."""
    launches = int(np.count_nonzero(names.mask(cols.rt_name, LAUNCH, GRAPH_LAUNCH)))
    return launches, int(np.count_nonzero(names.mask(cols.rt_name, COPY_CALL)))


def trace_state(cols: Columns, names: NameMasks, devices: list[int]) -> str:
    """One of :data:`STATES` (see the module docstring)."""
    dropped = sum(cols.dropped.values())
    if cols.used == 0 or dropped > cols.used:
        return NOT_UNDERSTOOD
    if devices:
        return GPU
    return NOT_RECORDED if any(host_calls(cols, names)) else CPU_ONLY


def outside_steps(cols: Columns, windows: list[Window]) -> int:
    """Device events, runtime calls and host ops that lie wholly outside the profiled steps:
    used by the whole-trace figures (busy time, the temporal breakdown), not by the per-step
    ones."""
    if not windows:
        return 0
    lo, hi = windows[0][1], windows[-1][2]
    return sum(
        int(np.count_nonzero((end <= lo) | (ts >= hi)))
        for ts, end in ((cols.dev_ts, cols.dev_end), (cols.rt_ts, cols.rt_end),
                        (cols.op_ts, cols.op_end))
    )  # fmt: skip


def read_section(cols: Columns, names: NameMasks, windows: list[Window]) -> ReadCounts:
    """report["trace"]["read"]: the events by fate (docs/profiling.md)."""
    launches, copies = host_calls(cols, names)
    return ReadCounts(
        events=cols.events,
        used=cols.used,
        skipped=cols.skipped,
        dropped=sum(cols.dropped.values()),
        dropped_by_reason={reason: cols.dropped.get(reason, 0) for reason in DROP_REASONS},
        outside_steps=outside_steps(cols, windows),
        host_launches=launches,
        host_copies=copies,
    )


def _plural(count: int, word: str) -> str:
    return f"{count:,} {word}" + ("" if count == 1 else "s")


def state_warnings(cols: Columns, names: NameMasks, state: str) -> list[str]:
    """The warnings of the state, and of events dropped for a reason no other warning names."""
    out: list[str] = []
    dropped = sum(cols.dropped.values())
    if state == NOT_UNDERSTOOD:
        reasons = ", ".join(f"{n:,} {r}" for r, n in cols.dropped.most_common() if n)
        out.append(
            f"trace not understood: {dropped:,} of its {cols.events:,} events were dropped "
            f"({reasons or 'none used'}) and {cols.used:,} used: it is not a torch.profiler "
            "(Kineto) trace, or one of a kind this reader does not know (a legacy "
            "autograd-profiler export, a rocprof or Nsight export); its figures describe "
            "only the events that were used, so it is neither a CPU-only nor a GPU report"
        )
        return out
    if state == CPU_ONLY:
        unknown = ", ".join(c for c, _ in cols.unknown_categories.most_common(3))
        out.append(
            "CPU-only trace: it holds no kernels, copies or sets on a GPU, so GPU utilization "
            "and the device metrics are not available"
            + (
                f" (its events of unknown categories, {unknown}, may be an accelerator's "
                "activity of a kind this reader does not know)"
                if unknown
                else ""
            )
        )
    elif state == NOT_RECORDED:
        launches, copies = host_calls(cols, names)
        made = f"{launches:,} kernel launch" + ("" if launches == 1 else "es")
        out.append(
            f"GPU activity not recorded: the host made {made} and "
            f"{_plural(copies, 'copy or set call')} but the trace holds no device "
            "events (kernels, copies, sets): the profiler did not record the GPU's activity "
            "(most likely CUDA activity was not enabled: ProfilerActivity.CUDA missing from "
            "activities, or CUPTI could not start), so GPU utilization cannot be measured"
        )
    for reason, what in (
        ("no category", "have no category (\"cat\")"),
        ("phase not handled", "have a phase the reader does not handle (it reads complete "
         "\"X\" events; begin/end pairs, async spans and the like are not)"),
        ("not an event object", "are not JSON objects"),
    ):  # fmt: skip
        if cols.dropped.get(reason):
            out.append(f"{_plural(cols.dropped[reason], 'event')} {what} and were dropped")
    return out
