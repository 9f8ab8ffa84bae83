"""The profile's gate, in one place: the gates' arguments checked, the --min-gpu-util and
--max-gpu-memory verdicts, and the report's memory figures from ``dlci profile``'s own passes.

:func:`check_gate` refuses a bound that is not a percentage; :func:`evaluate_gate` judges the
utilization, :func:`memory_gate` the memory (each verdict a :class:`Verdict`);
:func:`add_memory` puts the memory pass (its trace's memory section, its per-step figures,
:class:`Capture`) and the batch estimate into the report's ``memory``; :func:`combined_gate`
joins the verdicts of ``--min-gpu-util`` and ``--max-gpu-memory`` into the report's ``gate``
(a :class:`~dlci.report.fields.Gate`): passed only when every gate asked for passes, each one
listed under ``checks``. No torch here: ``dlci analyze`` runs on the runner host.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
from msgspec import UNSET, UnsetType

from dlci.errors import DlciError
from dlci.profiling.batchfit import Estimate, advice
from dlci.profiling.reader import read_trace
from dlci.report.fields import Gate, GateCheck, Memory, ReadCounts, Utilization


def check_gate(minimum: float | None, maximum_memory: float | None = None) -> None:
    """Refuse a ``--min-gpu-util`` or ``--max-gpu-memory`` that is not a percentage."""
    for name, value in (("min-gpu-util", minimum), ("max-gpu-memory", maximum_memory)):
        if value is not None and not 0 <= value <= 100:  # NaN too
            raise DlciError(
                f"--{name} must be a percentage from 0 to 100, got {value:g}",
                hint=f"for 40% write --{name} 40",
            )


class StepPeak(msgspec.Struct, kw_only=True):
    """One recorded step's peaks (reserved: None where the device reserves nothing)."""

    step: int
    peak_allocated_bytes: int
    peak_reserved_bytes: int | None = None


class Capture(msgspec.Struct, kw_only=True):
    """report["memory"]["capture"]: the memory pass's per-step peaks, the highest of them, the
    device's total and where the figures come from (docs/memory.md)."""

    device: str
    per_step: list[StepPeak] = []
    peak_allocated_bytes: int = 0
    peak_reserved_bytes: int | None = None
    device_total_bytes: int | None = None
    device_total_source: str = ""
    method: str = ""
    trace_file: str = ""
    log_file: str | None = None
    wall_time_s: float | UnsetType = UNSET  # the memory passes' time, once they are done


@dataclass(frozen=True)
class MemoryFigures:
    """What ``dlci profile`` measured beside the timed trace: the memory pass's trace, its
    per-step figures (report["memory"]["capture"]) and the batch size estimate."""

    trace: Path | None = None
    capture: Capture | None = None
    batch_estimate: Estimate | None = None
    # the option that left the memory pass out (``--no-memory``), said in the report's note
    skipped: str | None = None


GATE_HINT = (
    "profile on a GPU runner with dlci profile (it records memory unless --no-memory), or "
    "leave out --max-gpu-memory on the CPU path"
)


def _trace_memory(path: Any, max_size: int) -> Memory:
    """The memory section of the memory pass's own trace."""
    # numpy (memory): off the start-up of dlci analyze and dlci profile (analysis.py imports
    # this module)
    from dlci.profiling.memory import memory_section

    return memory_section(read_trace(path, max_size=max_size))


def add_memory(report: Utilization, figures: MemoryFigures, *, max_size: int) -> None:
    """The report's memory with the memory pass's trace and figures, and the batch advice.
    The figures go into the report's open tables (``capture``, ``batch_estimate``) as JSON
    holds them."""
    section = report.memory
    if figures.trace is not None:
        section = _trace_memory(figures.trace, max_size)
        section.trace_file = figures.trace.name
    if section is None:
        from dlci.profiling.memory import blank_section  # numpy: as in _trace_memory

        section = blank_section("none", "the trace's memory events were not read")
    if figures.skipped and section.source == "none":  # not the pass it just turned off
        section.note = (
            f"no memory figures: the timed trace holds no [memory] events and the memory pass "
            f"was left out ({figures.skipped}); run dlci profile without {figures.skipped} to "
            "record them"
        )
    estimate = figures.batch_estimate
    recommendation = advice(report, estimate)
    if recommendation is not None and estimate is not None:
        advised = f"{recommendation.finding}: {recommendation.advice}"
        estimate = msgspec.structs.replace(estimate, advice=advised)
        report.recommendations.append(recommendation)
    section.capture = None if figures.capture is None else msgspec.to_builtins(figures.capture)
    section.batch_estimate = None if estimate is None else msgspec.to_builtins(estimate)
    report.memory = section


def memory_percent(report: Utilization) -> tuple[float | None, str]:
    """The GPU's peak memory as a percentage of its total, and where it comes from: the
    profile's own measurement (peak reserved, else allocated) first, else the trace's."""
    memory = report.memory or Memory()
    capture = memory.capture or {}
    if str(capture.get("device") or "").startswith("cuda"):
        peak = capture.get("peak_reserved_bytes") or capture.get("peak_allocated_bytes")
        total = capture.get("device_total_bytes")
        if peak and total:
            return peak / total * 100, f"{capture['device']}, measured by dlci profile"
    if str(memory.device or "").startswith("cuda"):
        value = memory.peak_percent_of_device
        if isinstance(value, int | float):
            return float(value), f"{memory.device}, from the trace's memory events"
    return None, ""


STRICT_HINT = "pass --strict-gates to fail a run that has no GPU work"


class Verdict(msgspec.Struct, kw_only=True):
    """One gate's verdict, as :func:`combined_gate` joins them into the report's gate:
    ``judged`` when the figures supported a verdict, ``applicable`` (False) only for a GPU
    gate on a run without a GPU; UNSET where it does not apply."""

    name: str = ""
    minimum: float | None = None  # --min-gpu-util's bound
    value: float | None = None
    passed: bool
    judged: bool | UnsetType = UNSET
    applicable: bool | UnsetType = UNSET
    message: str = ""
    hint: str | None = None


def not_applicable(name: str, bound: str, no_gpu: str, minimum: float | None = None) -> Verdict:
    """A GPU gate on a run without a GPU: no verdict on the code, so no failure; the note
    says why (a laptop or a CPU runner gives the verdict CI gives on the same hardware)."""
    return Verdict(
        name=name,
        minimum=minimum,
        passed=True,
        applicable=False,
        message=f"not applicable: {no_gpu}; the {name} gate ({bound}) judges GPU runs only",
        hint=STRICT_HINT,
    )


def memory_gate(report: Utilization, maximum: float, no_gpu: str = "") -> Verdict:
    """The --max-gpu-memory check: passed, message, hint, value. ``no_gpu`` (why this run
    has no GPU, when the hardware has none) makes a missing figure not applicable."""
    value, where = memory_percent(report)
    unjudged = cannot_judge(report) if value is None else None
    if value is None and no_gpu and unjudged is None:
        return not_applicable("max-gpu-memory", f"{maximum:g}%", no_gpu)
    if value is None:
        why = (
            unjudged[0]
            if unjudged
            else "the report has no GPU memory figures (a CPU run, or a trace without "
            "[memory] events)"
        )
        return Verdict(
            name="max-gpu-memory",
            passed=False,
            judged=False,
            message=f"could not judge: the GPU memory gate cannot be evaluated: {why}",
            hint=unjudged[1] if unjudged else GATE_HINT,
        )
    passed = value <= maximum
    relation = "<=" if passed else "is above the maximum of"
    return Verdict(
        name="max-gpu-memory",
        passed=passed,
        judged=True,
        value=value,
        message=f"GPU peak memory {value:.1f}% of the device ({where}) {relation} {maximum:g}%",
        hint=None if passed else "lower the batch size, or see the memory section",
    )


def _check(verdict: Verdict, name: str) -> GateCheck:
    """A verdict as the gate's ``checks`` lists it (judged: False unless it was)."""
    judged = verdict.judged is True
    return GateCheck(
        name=name, passed=verdict.passed, judged=judged, message=verdict.message, hint=verdict.hint
    )


def combined_gate(
    report: Utilization,
    util_gate: Verdict | None,
    *,
    max_gpu_memory: float | None,
    no_gpu: str = "",
) -> Gate | None:
    """The report's gate: the --min-gpu-util gate's keys as before, "passed" only when every
    gate asked for passes, "message" the failing ones' messages, and "checks"."""
    memory = None if max_gpu_memory is None else memory_gate(report, max_gpu_memory, no_gpu)
    checks = [_check(util_gate, "min-gpu-util")] if util_gate is not None else []
    checks += [_check(memory, "max-gpu-memory")] if memory is not None else []
    if not checks:
        return None
    failed = [c for c in checks if not c.passed]
    gate = Gate(
        minimum=util_gate.minimum if util_gate else None,
        value=util_gate.value if util_gate else None,
        passed=not failed,
        judged=util_gate.judged if util_gate else UNSET,
        applicable=util_gate.applicable if util_gate else UNSET,
        message="; ".join(c.message for c in failed or checks),
        hint=next((c.hint for c in failed if c.hint), None),
        checks=checks,
    )
    if memory is not None and max_gpu_memory is not None:
        gate.max_gpu_memory = max_gpu_memory
        gate.gpu_memory_pct = memory.value
    idle = [v for v in (util_gate, memory) if v is not None and v.applicable is False]
    if idle:  # one note for the gates that did not apply, the bounds named once each
        gate.applicable = False
        named = [f"min-gpu-util {util_gate.minimum:g}%"] if util_gate else []
        named += [f"max-gpu-memory {max_gpu_memory:g}%"] if memory is not None else []
        bounds = ", ".join(named)
        gate.message = f"not applicable: {no_gpu}; the GPU gates ({bounds}) judge GPU runs only"
        gate.hint = STRICT_HINT
    return gate


def cannot_judge(report: Utilization) -> tuple[str, str] | None:
    """Why the trace cannot support a GPU verdict at all, and what to do, or None: its GPU
    activity was not recorded, or it was not understood (docs/profiling.md, trace.state)."""
    read = report.trace.read or ReadCounts()
    state = report.trace.state
    if state == "gpu activity not recorded":
        return (
            f"GPU activity not recorded: the host made {read.host_launches:,} "
            f"kernel launches and {read.host_copies:,} copy or set calls, but the "
            "trace holds no device events",
            "record CUDA activity: torch.profiler.profile(activities=[ProfilerActivity.CPU, "
            "ProfilerActivity.CUDA]) (dlci profile does on a GPU), and check that CUPTI starts",
        )
    if state == "not understood":
        return (
            f"the trace was not understood ({read.dropped:,} of "
            f"{read.events:,} events dropped, {read.used:,} used)",
            "give a trace written by torch.profiler (export_chrome_trace or "
            "tensorboard_trace_handler)",
        )
    return None


def evaluate_gate(report: Utilization, minimum: float | None, no_gpu: str = "") -> Verdict | None:
    """The --min-gpu-util verdict, with the reasons when it fails; ``no_gpu`` (why this run
    has no GPU, when the hardware has none) makes a trace without GPU work not applicable."""
    if minimum is None:
        return None
    value = report.gpu_utilization_pct
    unjudged = cannot_judge(report)
    name = "min-gpu-util"
    if unjudged is not None:  # not even on a CPU runner: the trace itself says too little
        return Verdict(
            name=name,
            minimum=minimum,
            passed=False,
            judged=False,
            message=f"could not judge: the GPU utilization gate cannot be evaluated: {unjudged[0]}",
            hint=unjudged[1],
        )
    if value is None and no_gpu:
        return not_applicable(name, f"{minimum:g}%", no_gpu, minimum)
    if value is None:
        return Verdict(
            name=name,
            minimum=minimum,
            passed=False,
            judged=False,
            message="could not judge: the GPU utilization gate cannot be evaluated: the "
            "trace has no GPU work (a CPU-only trace)",
            hint="profile on a GPU runner; on a machine without one (hardware class cpu) "
            "dlci profile reads the gate (--min-gpu-util, or the configuration's "
            "min-gpu-util) as not applicable, unless --strict-gates",
        )
    passed = value >= minimum
    reasons = [r.finding for r in report.recommendations]
    message = f"GPU utilization {value:.1f}% is below the minimum of {minimum:g}%"
    if reasons:
        message += ": " + "; ".join(reasons)
    return Verdict(
        name=name,
        minimum=minimum,
        value=value,
        passed=passed,
        judged=True,
        message=message if not passed else f"GPU utilization {value:.1f}% >= {minimum:g}%",
        hint="see the recommendations in utilization.md" if reasons else None,
    )
