"""The utilization report's Markdown and PNG, drawn from its JSON and nothing else.

The report is a :class:`~dlci.report.fields.Utilization` from the writer
(dlci.profiling.metrics) to every reader: a utilization.json read back (the host's copy, a
baseline, a bisect step's) becomes one through :func:`read`, which names a field of the
wrong type before anything reads it.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from dlci.fsutil import atomic_write_bytes
from dlci.report import fields
from dlci.report.fields import Device, Gate, Memory, Process, Syncs, Trace, Utilization
from dlci.report.text import bullets, clean, label, md, md_code, shown, table

REPORT_NAME = "utilization.json"
MARKDOWN_NAME = "utilization.md"
PLOT_NAME = "utilization.png"

BREAKDOWN_LABELS = {
    "kernel": "kernel",
    "memcpy": "memcpy",
    "memset": "memset",
    "communication": "communication",
    "runtime": "runtime",
    "data_loading": "data loading",
    "cpu_exec": "CPU exec",
    "other": "other",
}
PHASE_LABELS = {"data_loading": "data loading"}
PHASE_LABELS |= {name: name for name in ("forward", "backward", "optimizer", "other")}
# the parts of a report the Markdown draws from, which every report dl-ci wrote has: a report
# without one of them is incomplete (its facts are still read, with the rest's defaults)
DRAWN = ("trace", "steps", "devices", "syncs", "recommendations", "warnings")


def read(raw: Any) -> Utilization:
    """A decoded utilization.json as the report's classes; ValueError naming each field of a
    wrong type (fields.problems), or the first required one missing (an incomplete report).
    The fields an older report lacks take their defaults.

    >>> read({"steps": {"count": 2}, "gpu_utilization_pct": 41.5}).steps.mean_step_us
    0.0
    >>> read({"syncs": {"count": "3"}})
    Traceback (most recent call last):
    ValueError: utilization.json: syncs.count is text, expected an integer
    >>> read({"devices": [{"name": "H100"}]})  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ValueError: utilization.json is incomplete: Object missing required field `device`...
    """
    return fields.read_as("utilization", Utilization, raw)


def check_compared(raw: dict[str, Any]) -> str | None:
    """What is wrong with a utilization.json another run wrote, for a comparison, or None:
    the figures compared out of range (compare.diff.check_report), else the first field of a
    wrong type.

    >>> check_compared({"gpu_utilization_pct": 250, "warnings": "x"})
    'gpu_utilization_pct: expected a number from 0 to 100, got 250'
    >>> check_compared({"warnings": "x"})
    'warnings is text, expected a list'
    """
    # numpy (compare.stats): off the start-up of dlci analyze and dlci profile, whose --help
    # and usage errors import this module (through profiling/analysis.py)
    from dlci.compare.diff import check_report

    return check_report(raw, lambda report: fields.problems("utilization", report, limit=1))


def _ms(us: float) -> str:
    return f"{us / 1e3:.2f} ms" if us >= 100 else f"{us:.1f} us"


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f}%"


def _count(value: object) -> int:
    """A count from the report, 0 when it is not one (a report from elsewhere may hold
    anything)."""
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def read_line(trace: Trace) -> str | None:
    """What the reader did with the trace's events, in one line (the console and the
    Markdown say the same): used, not needed, dropped by reason, outside any step."""
    read = trace.read
    if not read:
        return None  # a report written before the counts existed
    line = (
        f"read {read.events:,} events: {read.used:,} used, "
        f"{read.skipped:,} not needed (metadata, flows, marks), "
        f"{read.dropped:,} dropped"
    )
    reasons = read.dropped_by_reason
    listed = [f"{_count(n):,} {clean(r, limit=40)}" for r, n in reasons.items() if _count(n)]
    if listed:
        line += " (" + ", ".join(listed) + ")"
    outside = read.outside_steps
    if outside:
        line += f"; {outside:,} outside any profiled step (not in the per-step figures)"
    return line


def state_line(trace: Trace) -> str | None:
    """The trace's state when it is not a GPU trace, in words; None for a GPU trace."""
    state = trace.state
    read = trace.read or fields.ReadCounts()
    if state == "gpu activity not recorded":
        return (
            f"GPU activity not recorded: {read.host_launches:,} kernel launches "
            f"and {read.host_copies:,} copy or set calls on the host, no device "
            "events; likely cause: CUDA activity was not enabled"
        )
    if state == "not understood":
        return (
            f"trace not understood: {read.dropped:,} of "
            f"{read.events:,} events dropped, {read.used:,} used"
        )
    if state == "cpu-only" or (not state and trace.cpu_only):
        return "CPU-only trace, no GPU utilization"
    return None


def render_markdown(report: Utilization, *, gate: Gate | None = None) -> str:
    """The job-summary section of one utilization report."""
    title = "### Trace profile"
    state = state_line(report.trace)
    if report.trace.state == "cpu-only" or (not report.trace.state and report.trace.cpu_only):
        title += " (CPU-only trace: no GPU work recorded)"
    elif state is not None:
        title += f" ({md(state)})"
    lines = [title, ""]
    read = read_line(report.trace)
    if read is not None:
        lines += [f"_{md(read[0].upper() + read[1:])}._", ""]
    if gate is not None:
        lines += _gate_lines(gate)
    lines += [*table(["metric", "value", "definition"], _metric_rows(report)), ""]
    lines += _process_table(report.processes or [])
    lines += _share_tables(report)
    for device in report.devices:
        lines += _gap_table(device) + _copy_table(device)
    lines += _sync_table(report.syncs or Syncs())
    lines += memory_lines(report.memory)
    advice = [f"**{md(rec.finding)}**: {md(rec.advice)}." for rec in report.recommendations]
    warnings = [md(warning) for warning in report.warnings]
    for heading, items in (("Recommendations", advice), ("Warnings", warnings)):
        if items:
            lines += [f"#### {heading}", "", *bullets(items), ""]
    return "\n".join(lines)


def _gate_lines(gate: Gate) -> list[str]:
    """The gate's verdict: one line per check when the report lists them (the combined gate
    of --min-gpu-util and --max-gpu-memory), else the utilization gate's line."""
    mark = "passed" if gate.passed else "FAILED"
    if gate.checks:
        items = [
            f"{md(c.name)}: {'passed' if c.passed else 'FAILED'}: {md(c.message)}"
            for c in gate.checks
        ]
        return [f"**Gate {mark}**", "", *bullets(items), ""]
    return [
        f"**GPU utilization gate {mark}**: {_pct(gate.value)} against a minimum of "
        f"{gate.minimum:g}%.",
        "",
    ]


def _metric_rows(report: Utilization) -> list[list[str]]:
    steps = report.steps
    rows = [
        [
            "steps profiled",
            f"{steps.count} (mean {_ms(steps.mean_step_us)})",
            "ProfilerStep#N markers, ends moved to the end of their device work",
        ]
    ]
    for device in report.devices:
        name = f"GPU {md(device.device)}" + (f" ({md(device.name)})" if device.name else "")
        tb = device.temporal_breakdown
        rows += [
            [
                f"{name} utilization",
                _pct(device.gpu_utilization_pct),
                "kernels within the profiled steps' span (TensorBoard profiler)",
            ],
            [
                f"{name} busy",
                _pct(device.busy.busy_pct),
                "kernels, memcpy and memset over first-to-last device event (TraceLens)",
            ],
            [
                f"{name} idle / compute / non-compute",
                f"{tb.idle_pct:.1f}% / {tb.compute_pct:.1f}% / {tb.non_compute_pct:.1f}%",
                "temporal breakdown (Holistic Trace Analysis)",
            ],
        ]
    syncs = report.syncs or Syncs()
    rows.append(
        [
            "blocking syncs",
            f"{syncs.count} ({syncs.per_step:g} per step), {_ms(syncs.wait_us)} waited",
            "host calls that wait for the device",
        ]
    )
    return rows


def _process_table(processes: list[Process]) -> list[str]:
    """A merged trace's processes (ranks), each with its own steps and GPU."""
    if not processes:
        return []
    rows = []
    for entry in processes:
        util = entry.gpu_utilization_pct
        rows.append(
            [
                md(entry.pid),
                md(entry.rank if entry.rank is not None else "n/a"),
                md(entry.steps.count),
                _ms(entry.steps.mean_step_us),
                md(entry.primary_device if entry.primary_device is not None else "none"),
                _pct(util) if util is not None else "n/a",
            ]
        )
    headers = ["process", "rank", "steps", "mean step", "GPU", "GPU utilization"]
    title = "#### Processes (a merged trace: each one's own steps and GPU)"
    return [title, "", *table(headers, rows), ""]


def _share_tables(report: Utilization) -> list[str]:
    lines: list[str] = []
    for key, title, labels in (
        ("breakdown", "Step time breakdown", BREAKDOWN_LABELS),
        ("phases", "Where host step time goes", PHASE_LABELS),
    ):
        pct = report.shares(key)
        if pct:
            keys = [k for k in labels if k in pct]
            row = [f"{pct[k]:.1f}%" for k in keys]
            lines += [f"#### {title}", "", *table([labels[k] for k in keys], [row]), ""]
    return lines


def _gap_table(device: Device) -> list[str]:
    gaps = device.idle_gaps[:5]
    if not gaps:
        return []
    rows = [
        [
            _ms(gap.start_us),
            _ms(gap.duration_us),
            md(gap.cause),
            md_code(gap.cpu_op.name, limit=80) if gap.cpu_op else "(none)",
        ]
        for gap in gaps
    ]
    headers = ["at", "length", "cause", "CPU op running"]
    return [f"#### Largest idle gaps on GPU {md(device.device)}", "", *table(headers, rows), ""]


def _copy_table(device: Device) -> list[str]:
    copies = device.copies
    kinds = (
        (copies.h2d_pageable, "pageable"),
        (copies.h2d_pinned, "pinned"),
        (copies.h2d_other, "other"),
    )
    rows = [
        [
            name,
            str(c.count),
            f"{c.bytes:,}",
            _ms(c.time_us),
            f"{c.bandwidth_gbps:.1f} GB/s",
            _ms(c.exposed_us),
        ]
        for c, name in kinds
        if c.count
    ]
    if not rows:
        return []
    headers = ["memory", "copies", "bytes", "time", "bandwidth", "not hidden"]
    title = f"#### Host-to-device copies on GPU {md(device.device)}"
    return [title, "", *table(headers, rows), ""]


def _sync_table(syncs: Syncs) -> list[str]:
    rows = [
        [
            md_code(row.call, limit=80),
            md_code(row.caller, limit=80),
            str(row.count),
            _ms(row.wait_us),
            _ms(row.max_wait_us),
        ]
        for row in syncs.by_call[:8]
    ]
    if not rows:
        return []
    headers = ["host call", "made by", "count", "waited", "longest"]
    return ["#### Sync points", "", *table(headers, rows), ""]


def _bytes(value: object) -> str:
    """Bytes in binary units, the exact count beside them.

    >>> _bytes(8389388), _bytes(512), _bytes(None), _bytes(10**400)
    ('8.0 MiB (8,389,388 bytes)', '512 bytes', 'n/a', 'n/a')
    """
    if not isinstance(value, int | float) or isinstance(value, bool):
        return "n/a"
    if not abs(value) < 1 << 80:  # an open table's number no device holds (or NaN)
        return "n/a"
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(value) >= size:
            return f"{value / size:.1f} {unit} ({int(value):,} bytes)"
    return f"{int(value):,} bytes"


def memory_fact(memory: Memory | None) -> str | None:
    """One line for the job summary: the peak, its share of the device, the batch estimate.

    >>> memory_fact(Memory(source="none", note="x"))
    'no memory figures (the trace has no [memory] events)'
    >>> memory_fact(Memory(device="cuda:0", peak_reserved_bytes=3 << 30,
    ...                    peak_percent_of_device=21.4))
    'peak 3.0 GiB on cuda:0, 21.4% of the device'
    """
    if memory is None:
        return None
    capture = memory.capture or {}
    estimate = memory.batch_estimate
    device = str(capture.get("device") or memory.device or "n/a")
    if capture and device.startswith("cpu"):
        peak = capture.get("peak_allocated_bytes")
        line = f"peak {_bytes(peak).split(' (')[0]} resident on the CPU (the whole process)"
    else:
        found = (
            capture.get("peak_reserved_bytes"),
            memory.peak_reserved_bytes,
            capture.get("peak_allocated_bytes"),
            memory.peak_allocated_bytes,
        )
        peak = next((v for v in found if isinstance(v, int | float)), None)
        if peak is None:
            return "no memory figures (the trace has no [memory] events)"
        share = memory.peak_percent_of_device
        line = f"peak {_bytes(peak).split(' (')[0]} on {md(device)}"
        if isinstance(share, int | float) and not isinstance(share, bool):
            line += f", {_pct(share)} of the device"
    if isinstance(estimate, dict) and isinstance(estimate.get("largest_batch"), int):
        about = shown(estimate["largest_batch"], estimate.get("confidence"))
        line += (
            f"; largest batch that fits {md(about)} (batch "
            f"{md(estimate.get('batch_size'))}, confidence "
            f"{md(estimate.get('confidence') or 'n/a')})"
        )
    return line


PER_STEP_ROWS = 8  # a per-step memory table only for a trace with this many steps or fewer


def memory_lines(memory: Memory | None) -> list[str]:
    """The Memory section: peaks, the phase they fall in, the largest allocations by
    operator and, for a few steps, each step; the note alone when the trace has none."""
    if memory is None:
        return []  # a report written before the memory section existed
    lines = ["#### Memory", ""]
    if memory.note:
        lines += [f"_{md(memory.note)}_", ""]
    if memory.source == "trace":
        lines += [*table(["memory", "value"], _memory_rows(memory), align="lr"), ""]
        lines += _top_allocations(memory.top_allocations)
        steps = memory.steps
        if 0 < len(steps) <= PER_STEP_ROWS:
            rows = [
                [
                    md(s.get("step")),
                    _bytes(s.get("peak_allocated_bytes")),
                    _bytes(s.get("peak_reserved_bytes")),
                    md(s.get("peak_phase") or "n/a"),
                ]
                for s in steps
            ]
            headers = ["step", "peak allocated", "peak reserved", "peak phase"]
            lines += [*table(headers, rows, align="lrrl"), ""]
    lines += _measured_lines(memory)
    return lines


def _memory_rows(memory: Memory) -> list[list[str]]:
    share = memory.peak_percent_of_device
    return [
        ["device", md(memory.device or "n/a")],
        ["peak allocated", _bytes(memory.peak_allocated_bytes)],
        ["peak reserved", _bytes(memory.peak_reserved_bytes)],
        ["device memory", _bytes(memory.device_total_bytes)],
        ["peak, % of device", _pct(share) if share is not None else "n/a"],
        ["peak phase", md(memory.peak_phase or "n/a")],
    ]


def _top_allocations(rows: list[dict[str, Any]]) -> list[str]:
    if not rows:
        return []
    cells = [
        [md_code(r.get("operator"), limit=80), _bytes(r.get("bytes")), md(r.get("count"))]
        for r in rows
    ]
    title = "Largest allocations by operator (innermost host op; bytes summed over the steps)"
    return [
        f"_{title}_",
        "",
        *table(["operator", "allocated", "allocations"], cells, align="lrr"),
        "",
    ]


def _measured_lines(memory: Memory) -> list[str]:
    """dlci profile's own per-step figures and the batch estimate, when it added them."""
    lines: list[str] = []
    capture = memory.capture
    if capture is not None:
        device = capture.get("device") or "n/a"
        peak = _bytes(capture.get("peak_allocated_bytes"))
        figures = (  # on the CPU: the process's resident memory, not torch's allocator
            f"peak resident memory (the whole process) {peak}, memory available "
            if str(device).startswith("cpu")
            else f"peak allocated {peak}, peak reserved "
            f"{_bytes(capture.get('peak_reserved_bytes'))}, device memory "
        )
        lines.append(
            f"Measured by dlci profile on {md(device)}: {figures}"
            f"{_bytes(capture.get('device_total_bytes'))} ({md(capture.get('method') or '')})."
        )
    estimate = memory.batch_estimate
    if estimate is not None:
        about = shown(estimate.get("largest_batch"), estimate.get("confidence"))
        reason = estimate.get("confidence_reason")
        lines.append(
            f"Batch size {md(estimate.get('batch_size'))}; largest batch that fits: {md(about)} "
            f"(confidence {md(estimate.get('confidence') or 'n/a')}"
            + (f": {md(reason)}" if reason else "")
            + f"). {md(estimate.get('method') or '')}"
        )
        if estimate.get("advice"):
            lines.append(f"**Advice**: {md(estimate['advice'])}")
    return [*bullets(lines), ""] if lines else []


def plot(report: Utilization, path: Path) -> Path:
    """Per-step timeline: stacked breakdown bars and GPU utilization, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    per_step = report.per_step
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6), dpi=100, sharex=True)
    try:
        if per_step:
            x = list(range(len(per_step)))
            ticks = [label(s.step) for s in per_step]
            bottoms = [0.0] * len(per_step)
            for key, name in BREAKDOWN_LABELS.items():
                values = [s.breakdown.get(f"{key}_us", 0.0) / 1e3 for s in per_step]
                if any(values):
                    top.bar(x, values, bottom=bottoms, label=name)
                    bottoms = [b + v for b, v in zip(bottoms, values, strict=True)]
            top.set_ylabel("step time (ms)")
            top.set_ylim(0, max(max(bottoms), 1e-9) * 1.45)  # room for the legend
            top.legend(fontsize="small", ncol=4, loc="upper left")
            util = [s.gpu_utilization_pct for s in per_step]
            if any(u is not None for u in util):
                bottom.plot(x, [u or 0.0 for u in util], marker="o")
                bottom.set_ylim(0, 100)
                bottom.set_ylabel("GPU utilization (%)")
            else:
                phases = [
                    100.0 * s.phases.get("data_loading_us", 0.0) / s.host_duration_us
                    if s.host_duration_us
                    else 0.0
                    for s in per_step
                ]
                bottom.plot(x, phases, marker="o", color="#ff7f0e")
                bottom.set_ylabel("data loading (% of step)")
                bottom.set_ylim(0, 100)
            bottom.set_xticks(x, ticks)
            bottom.set_xlabel("profiler step")
        else:
            top.text(0.5, 0.5, "no ProfilerStep markers in the trace", ha="center")
        title = "trace profile"
        if report.gpu_utilization_pct is not None:
            title += f": GPU utilization {report.gpu_utilization_pct:.1f}%"
        else:
            state = report.trace.state
            title += f" ({state})" if isinstance(state, str) else " (CPU-only)"
        top.set_title(title)
        for ax in (top, bottom):
            ax.grid(alpha=0.3)
        fig.tight_layout()
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png")
    finally:
        plt.close(fig)
    return atomic_write_bytes(path, buffer.getvalue())
