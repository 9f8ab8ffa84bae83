"""A merged multi-process trace (several ranks in one file): steps per process, never chained.

Tools such as TraceLens's TraceFuse merge the ranks' traces of a distributed job into one
file for viewing, each rank's events under a process id of its own. Chaining the
ProfilerStep markers of all of them into one series of steps gives steps that overlap or
last 0 us, numbered 9, 9, 9, 9, 10, ...; so when the markers come from more than one
process, the report's own steps are refused (the whole trace is one window, with a warning
that says why) and each process is analysed on its own under ``processes``: its host events,
its step markers, and the device events its host calls launched (through
``args.correlation``; a device event no call launched goes with the process that launched
the rest of that GPU's work, when only one did). The top-level figures of a GPU whose work
one process launched are that process's, those its rank's own file gives.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

from dlci.profiling.columns import Columns
from dlci.profiling.memcols import MemoryColumns
from dlci.profiling.timeline import launch_rows
from dlci.report.fields import Process, Utilization

# what a process's entry under "processes" keeps of its own report
PROCESS_KEYS = (
    "steps",
    "primary_device",
    "gpu_utilization_pct",
    "devices",
    "per_step",
    "breakdown",
    "phases",
    "warnings",
)


def step_processes(cols: Columns) -> list[int]:
    """The processes whose host threads hold ProfilerStep markers."""
    return sorted({s[3] for s in cols.steps})


def shared_process(cols: Columns) -> str | None:
    """Why the steps cannot be told apart by process, or None: step markers of several ranks
    (``args.rank``) under one process id, as a merger that does not keep the ranks' process
    ids apart writes them."""
    for pid, ranks in sorted(cols.step_ranks.items()):
        if len(ranks) > 1:
            listed = ", ".join(str(r) for r in sorted(ranks)[:8])
            return (
                f"ProfilerStep markers of {len(ranks)} ranks ({listed}) share process id "
                f"{pid}: a merged trace that does not keep the ranks apart; its steps are "
                "refused (the whole trace is one window), and each rank's own trace gives "
                "its steps"
            )
    return None


def _memory_of(memory: MemoryColumns, keep: Any) -> MemoryColumns:
    arrays = [memory.ts, memory.tid, memory.pid, memory.bytes, memory.allocated]
    arrays += [memory.reserved, memory.device_type, memory.device_id]
    return MemoryColumns._of([a[keep] for a in arrays], 0)


def process_columns(cols: Columns, pid: int, rows: Any) -> tuple[Columns, Any]:
    """The columns of one process, and the launch rows of its device events."""
    owner = np.full(rows.size, np.iinfo(np.int64).min, dtype=np.int64)
    linked = rows >= 0
    owner[linked] = cols.rt_pid[rows[linked]]
    mine = linked & (owner == pid)
    own_devices = set(cols.dev_device[mine].tolist())
    shared = set(cols.dev_device[linked & (owner != pid)].tolist())
    only_mine = sorted(own_devices - shared)
    dev = mine | (~linked & np.isin(cols.dev_device, only_mine))
    rt = cols.rt_pid == pid
    op = cols.op_pid == pid
    # the launch rows of the kept device events, renumbered into the kept runtime calls
    new_index = np.cumsum(rt) - 1
    kept_rows = rows[dev]
    kept_rows = np.where(kept_rows >= 0, new_index[np.maximum(kept_rows, 0)], -1)
    fields: dict[str, Any] = {}
    for f in dataclasses.fields(Columns):
        if f.name.startswith("dev_"):
            fields[f.name] = getattr(cols, f.name)[dev]
        elif f.name.startswith("rt_"):
            fields[f.name] = getattr(cols, f.name)[rt]
        elif f.name.startswith("op_"):
            fields[f.name] = getattr(cols, f.name)[op]
    sub = dataclasses.replace(
        cols,
        **fields,
        steps=[s for s in cols.steps if s[3] == pid],
        gpu_step_starts=[],
        memory=_memory_of(cols.memory, cols.memory.pid == pid),
    )
    return sub, kept_rows


def merged_report(
    cols: Columns,
    pids: list[int],
    source: str,
    analyze_one: Callable[..., Utilization],
) -> Utilization:
    """The report of a trace with several processes' step markers: the whole trace as one
    window (its steps refused, with the reason), and one entry per process."""
    listed = ", ".join(str(p) for p in pids[:8]) + (", ..." if len(pids) > 8 else "")
    reason = (
        f"ProfilerStep markers from {len(pids)} processes (pids {listed}): a merged "
        "multi-process (multi-rank) trace; steps are not chained across processes, so the "
        "whole trace is one window here and each process's steps are analysed on their own "
        "under processes"
    )
    rows = launch_rows(cols)
    report = analyze_one(dataclasses.replace(cols, steps=[]), source=source, refused=reason,
                         rows=rows)  # fmt: skip
    entries = []
    owners: dict[int, set[int]] = {}
    for pid in pids:
        sub, sub_rows = process_columns(cols, pid, rows)
        own = analyze_one(sub, source=source, rows=sub_rows)
        ranks = cols.step_ranks.get(pid, set())
        entries.append(
            Process(
                pid=pid,
                rank=min(ranks) if len(ranks) == 1 else None,
                **{key: getattr(own, key) for key in PROCESS_KEYS},
            )
        )
        for device in sub.dev_device.tolist():
            owners.setdefault(device, set()).add(pid)
    report.processes = entries
    owned = {
        d.device: d
        for entry in entries
        for d in entry.devices
        if len(owners.get(d.device, ())) == 1
    }
    # a GPU one process launched to: its figures are that process's (its rank's own file's)
    report.devices = [owned.get(d.device, d) for d in report.devices]
    primary = max(report.devices, key=lambda d: d.busy.busy_us, default=None)
    report.primary_device = primary.device if primary else None
    report.gpu_utilization_pct = primary.gpu_utilization_pct if primary else None
    for device, found in sorted(owners.items()):
        if len(found) > 1:
            report.warnings.append(
                f"GPU {device} holds device work launched by {len(found)} processes: the "
                "ranks' GPUs share an index in this merged trace (ranks on different "
                f"machines), so the top-level figures of GPU {device} (over the whole trace) "
                "mix them; each process's own figures are under processes"
            )
    return report
