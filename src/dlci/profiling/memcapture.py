"""``dlci profile``'s memory pass, and the memory figures it hands to the gate.

The timed trace (capture.py) records no memory: ``profile_memory=True`` adds an event per
allocation and would change the time figures. After it, :func:`memory_pass` trains a few more
steps of its own in a trace session (session.py) under ``torch.profiler(profile_memory=True)``,
writing trace-memory.json.gz (the ``[memory]`` events the report's memory section is built
from), and measures each step's peak with meter.PeakMeter; then the batch size estimate
(batchfit.py). Nothing here imports torch at module level.
"""

from __future__ import annotations

import contextlib
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from dlci.profiling.batchfit import Estimate, ResizeError, estimate, refused
from dlci.profiling.gate import Capture, MemoryFigures, StepPeak
from dlci.profiling.meter import PeakMeter, device_label, device_total
from dlci.profiling.session import MEMORY_TRACE_NAME, Schedule, TraceSession
from dlci.report.text import shown

MEMORY_LOG_NAME = "profiler-memory.log"  # what torch.profiler printed during the memory pass
MEMORY_STEPS = 3  # recorded steps of the memory pass, after one warmup step


def memory_pass(
    target: Any, *, out: Path, device: str | None, seed: int, steps: int = MEMORY_STEPS
) -> Capture:
    """Train ``steps`` steps (after one warmup) under torch.profiler(profile_memory=True),
    write OUT/trace-memory.json.gz, and return report["memory"]["capture"]."""
    schedule = Schedule(wait=0, warmup=1, active=steps)
    session = TraceSession(
        target, schedule=schedule, trace=out / MEMORY_TRACE_NAME, log=out / MEMORY_LOG_NAME,
        device=device, seed=seed, memory=True,
    )  # fmt: skip
    meter = PeakMeter(session.device)
    per_step: list[StepPeak] = []

    def on_step(step: int, total: int) -> None:
        if schedule.phase_of(step) == "record":
            allocated, reserved = session.peaks
            per_step.append(
                StepPeak(
                    step=len(per_step), peak_allocated_bytes=allocated, peak_reserved_bytes=reserved
                )
            )

    with meter:
        trace = session.run(on_step=on_step, meter=meter, no_trace_hint="run with --no-memory")
    log = session.log
    total, total_source = device_total(session.device)
    reserved_peaks = [s.peak_reserved_bytes for s in per_step if s.peak_reserved_bytes]
    return Capture(
        device=device_label(session.device),
        per_step=per_step,
        peak_allocated_bytes=max(s.peak_allocated_bytes for s in per_step),
        peak_reserved_bytes=max(reserved_peaks) if reserved_peaks else None,
        device_total_bytes=total,
        device_total_source=total_source,
        method=meter.method,
        trace_file=trace.name,
        log_file=log.name if log is not None else None,
    )


def measure_memory(
    target: Any, *, out: Path, device: str | None, seed: int, say: Callable[[str], None]
) -> MemoryFigures:
    """``dlci profile``'s memory figures: the memory pass, then the batch size estimate (or
    why there is none: batches that cannot be joined or cut to another size)."""
    start = time.perf_counter()
    with kept_state(target.model, say):
        capture = memory_pass(target, out=out, device=device, seed=seed)
        say(f"wrote {out / capture.trace_file}: the trace of the memory pass")
        if capture.log_file is not None:
            say(f"wrote {out / capture.log_file}: what torch.profiler printed in the memory pass")
        try:
            batch = estimate(target, device=device, seed=seed)
        except ResizeError as exc:
            batch = refused(exc.message)
            say(f"no batch size estimate: {exc.message}")
    capture.wall_time_s = time.perf_counter() - start
    say(summary(capture, batch))
    return MemoryFigures(trace=out / capture.trace_file, capture=capture, batch_estimate=batch)


def summary(capture: Capture, batch: Estimate) -> str:
    """The memory pass and the estimate in one console line; on the CPU it says the figure
    is the whole process's resident memory, not torch's allocations.

    >>> cpu = Capture(device="cpu", peak_allocated_bytes=3 << 20, device_total_bytes=8 << 30,
    ...               wall_time_s=1.0)
    >>> for part in summary(cpu, Estimate(largest_batch=12345, confidence="low")).split("; "):
    ...     print(part)
    memory peak 3.0 MiB resident (the whole process, peak RSS)
    largest batch that fits: about 12,000 (confidence low), 1.0 s
    >>> gpu = Capture(device="cuda:0", peak_allocated_bytes=3 << 20,
    ...               peak_reserved_bytes=4 << 20, device_total_bytes=8 << 30, wall_time_s=1.0)
    >>> for part in summary(gpu, Estimate(largest_batch=None)).split("; "):
    ...     print(part)
    memory peak 3.0 MiB allocated, 4.0 MiB reserved (0.0% of cuda:0)
    no batch size estimate, 1.0 s
    """
    mib = 2**20
    peak, reserved = capture.peak_allocated_bytes, capture.peak_reserved_bytes
    total = capture.device_total_bytes
    seconds = capture.wall_time_s or 0.0
    if capture.device.startswith("cpu"):
        line = f"memory peak {peak / mib:,.1f} MiB resident (the whole process, peak RSS)"
    else:
        line = f"memory peak {peak / mib:,.1f} MiB allocated"
        if reserved is not None:
            line += f", {reserved / mib:,.1f} MiB reserved"
        if total:
            line += f" ({100.0 * (reserved or peak) / total:.1f}% of {capture.device})"
    if batch.largest_batch is None or batch.confidence == "none":
        return f"{line}; no batch size estimate, {seconds:.1f} s"
    about = shown(batch.largest_batch, batch.confidence)
    return (
        f"{line}; largest batch that fits: {about} (confidence {batch.confidence}), {seconds:.1f} s"
    )


@contextlib.contextmanager
def kept_state(model: Any, say: Callable[[str], None]) -> Iterator[None]:
    """The model's weights and buffers as they were before the memory passes, put back after
    them: the passes train it further, and a target shared with other code must come back
    as the timed profile left it. The copy goes to an unnamed temporary file (ours alone,
    gone when closed), so that it adds nothing to the memory measured: on the CPU, the
    process's resident memory. A state torch cannot save or load back is said, not fatal."""
    import torch

    with tempfile.TemporaryFile() as saved:
        try:
            torch.save(model.state_dict(), saved)
        except Exception as exc:  # an extra state that cannot be pickled, and the like
            say(f"{_NOT_KEPT}: it could not be saved ({type(exc).__name__}: {exc})")
            yield
            return
        try:
            yield
        finally:
            saved.seek(0)
            try:  # our own file, written just above: not outside input
                state = torch.load(saved, map_location="cpu", weights_only=False)
                with torch.no_grad():
                    model.load_state_dict(state)
            except Exception as exc:  # the passes changed the model's structure
                say(f"{_NOT_KEPT}: it could not be loaded back ({type(exc).__name__}: {exc})")


_NOT_KEPT = "the memory passes leave the model trained further"
