"""Analyse a trace file, apply the GPU utilization gate, and write the report's files.

The one path behind ``dlci analyze`` and ``dlci profile``: :func:`analyze_trace` reads the
trace, builds the report (:mod:`dlci.profiling.metrics`), adds the memory figures ``dlci
profile`` measured itself (memory pass, batch estimate: :mod:`dlci.profiling.memcapture`,
:mod:`dlci.profiling.batchfit`), the verdict of the gates asked for (``--min-gpu-util``,
``--max-gpu-memory``), and writes utilization.json, .md and .png where :class:`Destinations`
says, telling the caller each file as it is written. Nothing here imports torch or
matplotlib, except the PNG writer.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from dlci import jsonio
from dlci.errors import DlciError
from dlci.fsutil import atomic_write_text
from dlci.profiling.gate import MemoryFigures, add_memory, check_gate, combined_gate, evaluate_gate
from dlci.profiling.reader import DEFAULT_MAX_SIZE, read_trace
from dlci.report import utilization
from dlci.report.fields import Gate, Memory, Utilization

REPORT_NAME = "utilization.json"
MARKDOWN_NAME = "utilization.md"
PLOT_NAME = "utilization.png"
STDOUT = "-"  # the JSON destination that means standard output (written by the verb)


@dataclass(frozen=True)
class Destinations:
    """Where the report's JSON, Markdown and PNG go; None writes nothing of that kind."""

    json: str | None = None
    markdown: str | None = None
    plot: str | None = None

    @classmethod
    def choose(
        cls,
        out: str | os.PathLike[str] | None,
        *,
        json: str | None = None,
        markdown: str | None = None,
        plot: str | None = None,
    ) -> Destinations:
        """Paths given one by one win; ``out`` fills in the rest with the usual names.

        >>> Destinations.choose("art", markdown="u.md")
        Destinations(json='art/utilization.json', markdown='u.md', plot='art/utilization.png')
        >>> Destinations.choose(None, json="-")
        Destinations(json='-', markdown=None, plot=None)
        """

        def pick(given: str | None, name: str) -> str | None:
            return given or (str(Path(out) / name) if out is not None else None)

        return cls(pick(json, REPORT_NAME), pick(markdown, MARKDOWN_NAME), pick(plot, PLOT_NAME))


@dataclass
class Analysis:
    """A trace's report, its gate verdict, and the files written from it."""

    report: Utilization
    gate: Gate | None = None
    written: list[Path] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        """False only when the gate was asked for and failed."""
        return self.gate is None or self.gate.passed


def analyze_trace(
    trace: str | os.PathLike[str],
    destinations: Destinations,
    *,
    min_gpu_util: float | None = None,
    max_gpu_memory: float | None = None,
    memory: MemoryFigures | None = None,
    max_size: int | None = None,
    on_written: Callable[[Path], None] | None = None,
    no_gpu: str = "",
) -> Analysis:
    """Read ``trace``, build its report with the gates' verdict, and write its files.
    ``no_gpu``: why the run has no GPU (the hardware has none), which makes a GPU gate on a
    trace without GPU work not applicable instead of failed."""
    check_gate(min_gpu_util, max_gpu_memory)
    size = max_size or DEFAULT_MAX_SIZE
    # numpy (metrics): off the start-up of dlci analyze and dlci profile, whose --help and
    # usage errors import this module
    from dlci.profiling.metrics import analyze

    report = analyze(read_trace(trace, max_size=size), source=str(trace))
    if memory is not None:
        add_memory(report, memory, max_size=size)
    gate = combined_gate(
        report,
        evaluate_gate(report, min_gpu_util, no_gpu),
        max_gpu_memory=max_gpu_memory,
        no_gpu=no_gpu,
    )
    if gate is not None:
        report.gate = gate
    analysis = Analysis(report, gate)

    def wrote(path: Path) -> None:
        analysis.written.append(path)
        if on_written is not None:
            on_written(path)

    write_reports(report, destinations, on_written=wrote)
    return analysis


def write_reports(
    report: Utilization,
    destinations: Destinations,
    *,
    on_written: Callable[[Path], None] | None = None,
) -> None:
    """Write the JSON, Markdown and PNG in that order; a failure keeps the earlier files."""
    done = on_written or (lambda path: None)
    if destinations.json and destinations.json != STDOUT:
        done(jsonio.write(destinations.json, report))
    if destinations.markdown:
        markdown = utilization.render_markdown(report, gate=report.gate or None)
        done(atomic_write_text(destinations.markdown, markdown))
    if destinations.plot:
        try:
            done(utilization.plot(report, Path(destinations.plot)))
        except ImportError:
            raise DlciError(
                "the PNG (--plot, --out) needs matplotlib, which is not installed",
                hint="pip install 'dl-ci[train]', or leave out --plot",
            ) from None


def summary_lines(report: Utilization) -> list[str]:
    """The report in a few console lines (not escaped: the caller prints them through clean)."""
    steps = report.steps
    lines = [
        f"{report.trace.events:,} events, {steps.count} profiled steps "
        f"(mean {steps.mean_step_us / 1e3:.2f} ms)"
    ]
    read = utilization.read_line(report.trace)
    if read is not None:
        lines.append(read)
    state = utilization.state_line(report.trace)
    if state is not None:
        lines.append(state)
    elif report.gpu_utilization_pct is None:
        lines.append("CPU-only trace, no GPU utilization")
    for entry in report.processes or []:
        util = entry.gpu_utilization_pct
        lines.append(
            f"process {entry.pid}"
            + (f" (rank {entry.rank})" if entry.rank is not None else "")
            + f": {entry.steps.count} steps (mean {entry.steps.mean_step_us / 1e3:.2f}"
            " ms), "
            + (f"GPU {entry.primary_device} utilization {util:.1f}%" if util is not None
               else "no GPU work")
        )  # fmt: skip
    for device in report.devices:
        tb = device.temporal_breakdown
        lines.append(
            f"GPU {device.device}: utilization {device.gpu_utilization_pct:.1f}%, "
            f"busy {device.busy.busy_pct:.1f}%, idle {tb.idle_pct:.1f}% / compute "
            f"{tb.compute_pct:.1f}% / non-compute {tb.non_compute_pct:.1f}%"
        )
    phases = report.shares("phases")
    if phases:
        split = ", ".join(f"{k.replace('_', ' ')} {v:.1f}%" for k, v in phases.items())
        lines.append(f"host step time: {split}")
    lines += _memory_lines(report.memory or Memory())
    lines += [f"recommendation: {r.finding}: {r.advice}" for r in report.recommendations]
    lines += [f"warning: {w}" for w in report.warnings]
    return lines


def _memory_lines(memory: Memory) -> list[str]:
    """The memory section in one line: the peak from the trace's events, or why none.

    >>> _memory_lines(Memory(source="trace", device="cpu", peak_allocated_bytes=0))
    ['memory on cpu: the trace recorded no allocation']
    >>> _memory_lines(Memory(source="trace", device="cuda:0", peak_allocated_bytes=20480))
    ['memory on cuda:0: peak allocated 20.0 KiB']
    """
    peak = memory.peak_allocated_bytes
    if memory.source != "trace" or peak is None:
        return [f"memory: {memory.note}"] if memory.note else []
    if peak == 0:  # a model too small for torch's allocator to record a block on its own
        return [f"memory on {memory.device}: the trace recorded no allocation"]
    size = f"{peak / 2**20:,.1f} MiB" if peak >= 2**20 else f"{peak / 2**10:,.1f} KiB"
    line = f"memory on {memory.device}: peak allocated {size}"
    if memory.device == "cpu":  # torch's CPU counts start with profiling (the note)
        line += " (torch's CPU allocations while profiling ran, not the whole process)"
    reserved, pct = memory.peak_reserved_bytes, memory.peak_percent_of_device
    if reserved is not None:
        line += f", reserved {reserved / 2**20:,.1f} MiB"
    if pct is not None:
        line += f" ({pct:.1f}% of the device)"
    if memory.peak_phase:
        line += f", peak in {memory.peak_phase}"
    return [line]
