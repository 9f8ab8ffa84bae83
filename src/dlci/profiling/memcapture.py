"""Peak memory per training step, and ``dlci profile``'s memory pass.

The timed trace (capture.py) records no memory: ``profile_memory=True`` adds an event per
allocation and would change the time figures. After it, :func:`memory_pass` trains a few more
steps of its own under ``torch.profiler(profile_memory=True)``, writing trace-memory.json.gz
(the ``[memory]`` events the report's memory section is built from), and measures each step's
peak with :class:`PeakMeter`:

- on a GPU, ``torch.cuda.max_memory_allocated`` / ``max_memory_reserved`` after
  ``reset_peak_memory_stats`` before the step: exact figures of torch's caching allocator;
- on the CPU, the process's peak resident set (RSS): ``VmHWM`` of /proc/self/status, reset
  before each step by writing ``5`` to /proc/self/clear_refs (Linux 4.0+), after returning
  freed heap memory to the system (``malloc_trim``) so the step's own growth shows; where the
  reset is refused, ``VmRSS`` sampled every millisecond during the step (a peak shorter than
  that can be missed). The method says which was used.

Nothing here imports torch at module level.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dlci.errors import DlciError
from dlci.profiling.native_stderr import NativeStderr

if TYPE_CHECKING:
    from dlci.profiling.analysis import MemoryFigures

MEMORY_LOG_NAME = "profiler-memory.log"  # what torch.profiler printed during the memory pass
MEMORY_STEPS = 3  # recorded steps of the memory pass, after one warmup step
METHOD_CUDA = (
    "torch.cuda.max_memory_allocated and max_memory_reserved, peak statistics reset before "
    "each step"
)
METHOD_HWM = (
    "process peak RSS: VmHWM of /proc/self/status, reset before each step through "
    "/proc/self/clear_refs"
)
METHOD_SAMPLED = (
    "process RSS sampled every millisecond during each step (VmRSS of /proc/self/status; "
    "the peak reset was refused, so a shorter peak can be missed)"
)
_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")
_CGROUP_LIMITS = (  # cgroup v2, then v1
    Path("/sys/fs/cgroup/memory.max"),
    Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"),
)


def _status_bytes(field: str) -> int | None:
    """A ``kB`` field of /proc/self/status in bytes, None where there is none."""
    try:
        text = _STATUS.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith(field + ":"):
            parts = line.split()
            return int(parts[1]) * 1024 if len(parts) >= 2 and parts[1].isdigit() else None
    return None


def _trim_heap() -> None:
    """Collect garbage and give freed heap pages back (glibc), so RSS follows the step."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def _reset_hwm() -> bool:
    """Reset VmHWM to the current RSS; False where the kernel or sandbox refuses."""
    try:
        with _CLEAR_REFS.open("w") as f:
            f.write("5")
    except OSError:
        return False
    return _status_bytes("VmHWM") is not None


class _Sampler:
    """VmRSS read every millisecond on a thread; the largest value seen."""

    def __init__(self) -> None:
        self.peak = _status_bytes("VmRSS") or 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.001):
            self.peak = max(self.peak, _status_bytes("VmRSS") or 0)

    def finish(self) -> int:
        self._stop.set()
        self._thread.join()
        return max(self.peak, _status_bytes("VmRSS") or 0)


class PeakMeter:
    """One step's peak memory: ``start()`` before the step, ``stop()`` after it."""

    def __init__(self, device: Any) -> None:
        self.device = device
        self.cuda = getattr(device, "type", str(device)) == "cuda"
        self.hwm = not self.cuda and _reset_hwm()
        self.method = METHOD_CUDA if self.cuda else METHOD_HWM if self.hwm else METHOD_SAMPLED
        self._sampler: _Sampler | None = None

    def start(self) -> None:
        if self.cuda:
            import torch

            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            return
        _trim_heap()
        if self.hwm:
            self.hwm = _reset_hwm()
            if not self.hwm:
                self.method = METHOD_SAMPLED
        if not self.hwm:
            self._sampler = _Sampler()

    def stop(self) -> tuple[int, int | None]:
        """(peak allocated, peak reserved): on the CPU (peak RSS, None)."""
        if self.cuda:
            import torch

            torch.cuda.synchronize(self.device)
            return (
                int(torch.cuda.max_memory_allocated(self.device)),
                int(torch.cuda.max_memory_reserved(self.device)),
            )
        if self._sampler is not None:
            peak, self._sampler = self._sampler.finish(), None
            return peak, None
        return _status_bytes("VmHWM") or 0, None


def device_label(device: Any) -> str:
    """``cuda:N`` even for a plain ``cuda`` (the current device), as the trace side names it."""
    if getattr(device, "type", None) == "cuda" and getattr(device, "index", 0) is None:
        import torch

        return f"cuda:{torch.cuda.current_device()}"
    return str(device)


def _cgroup_limit() -> int | None:
    """The memory limit of the process's control group (v2, then v1), None when unlimited."""
    for path in _CGROUP_LIMITS:
        with contextlib.suppress(OSError, ValueError):
            text = path.read_text().strip()
            if text != "max":
                return int(text)
    return None


def device_total(device: Any) -> tuple[int | None, str]:
    """The memory the step may use, and where that figure comes from.

    GPU: the device's total memory. CPU: the control group's limit when one is set below the
    machine's memory, else MemTotal of /proc/meminfo.
    """
    if getattr(device, "type", str(device)) == "cuda":
        import torch

        total = int(torch.cuda.get_device_properties(device).total_memory)
        return total, "torch.cuda.get_device_properties(device).total_memory"
    machine = None
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                machine = int(line.split()[1]) * 1024
    limit = _cgroup_limit()
    if limit is not None and (machine is None or limit < machine):
        return limit, "the control group's memory limit (cgroup memory.max)"
    if machine is None:
        return None, "unknown (no /proc/meminfo)"
    return machine, "the machine's memory (MemTotal of /proc/meminfo; no lower cgroup limit)"


def _step_figures(step: int, allocated: int, reserved: int | None) -> dict[str, Any]:
    return {"step": step, "peak_allocated_bytes": allocated, "peak_reserved_bytes": reserved}


def memory_pass(
    target: Any, *, out: Path, device: str | None, seed: int, steps: int = MEMORY_STEPS
) -> dict[str, Any]:
    """Train ``steps`` steps (after one warmup) under torch.profiler(profile_memory=True),
    write OUT/trace-memory.json.gz, and return report["memory"]["capture"]."""
    from dlci.profiling.capture import (
        MEMORY_TRACE_NAME,
        Schedule,
        _batches,
        _torch_profile,
        _TraceWriter,
        _Trainer,
    )

    trainer = _Trainer(target, device, seed)
    schedule = Schedule(wait=0, warmup=1, active=steps)
    writer = _TraceWriter(out / MEMORY_TRACE_NAME)
    meter = PeakMeter(trainer.device)
    per_step: list[dict[str, Any]] = []
    batches = _batches(target.train_loader, schedule.total)
    with NativeStderr(out / MEMORY_LOG_NAME) as native:  # as in capture.profile_target
        try:
            with native.held():
                prof = _torch_profile(schedule, trainer.device, writer, memory=True).__enter__()
            try:  # held throughout: torch warns on fd 2 about blocks allocated before it
                for step in range(1, schedule.total + 1):
                    with native.held():
                        meter.start()
                        trainer.step(batches, step)
                        allocated, reserved = meter.stop()
                        prof.step()
                    if schedule.phase_of(step) == "record":
                        per_step.append(_step_figures(len(per_step), allocated, reserved))
            finally:
                with native.held():
                    prof.__exit__(None, None, None)
        except BaseException:
            native.replay()
            native.discard()
            raise
        log = native.keep_if_any()
    if not writer.written:
        raise DlciError("torch.profiler wrote no memory trace", hint="run with --no-memory")
    total, total_source = device_total(trainer.device)
    reserved_peaks = [s["peak_reserved_bytes"] for s in per_step if s["peak_reserved_bytes"]]
    return {
        "device": device_label(trainer.device),
        "per_step": per_step,
        "peak_allocated_bytes": max(s["peak_allocated_bytes"] for s in per_step),
        "peak_reserved_bytes": max(reserved_peaks) if reserved_peaks else None,
        "device_total_bytes": total,
        "device_total_source": total_source,
        "method": meter.method,
        "trace_file": writer.path.name,
        "log_file": log.name if log is not None else None,
    }


def measure_memory(
    target: Any, *, out: Path, device: str | None, seed: int, say: Callable[[str], None]
) -> MemoryFigures:
    """``dlci profile``'s memory figures: the memory pass, then the batch size estimate (or
    why there is none: batches that cannot be joined or cut to another size)."""
    from dlci.profiling.analysis import MemoryFigures
    from dlci.profiling.batchfit import ResizeError, estimate, refused

    start = time.perf_counter()
    with kept_state(target.model, say):
        capture = memory_pass(target, out=out, device=device, seed=seed)
        say(f"wrote {out / capture['trace_file']}: memory pass, {capture['method']}")
        if capture["log_file"] is not None:
            say(
                f"wrote {out / capture['log_file']}: what torch.profiler printed in the memory pass"
            )
        try:
            batch = estimate(target, device=device, seed=seed)
        except ResizeError as exc:
            batch = refused(exc.message)
            say(f"no batch size estimate: {exc.message}")
    capture["wall_time_s"] = time.perf_counter() - start
    say(summary(capture, batch))
    return MemoryFigures(trace=out / capture["trace_file"], capture=capture, batch_estimate=batch)


def summary(capture: dict[str, Any], batch: dict[str, Any]) -> str:
    """The memory pass and the estimate in one console line; on the CPU it says the figure
    is the whole process's resident memory, not torch's allocations.

    >>> cpu = {"device": "cpu", "peak_allocated_bytes": 3 << 20, "peak_reserved_bytes": None,
    ...        "device_total_bytes": 8 << 30, "wall_time_s": 1.0}
    >>> for part in summary(cpu, {"largest_batch": 12345, "confidence": "low"}).split("; "):
    ...     print(part)
    memory peak 3.0 MiB resident (the whole process, peak RSS)
    largest batch that fits: 12,345 (confidence low), 1.0 s
    >>> gpu = dict(cpu, device="cuda:0", peak_reserved_bytes=4 << 20)
    >>> summary(gpu, {"largest_batch": None, "confidence": "none"}).split("; ")[0]
    'memory peak 3.0 MiB allocated, 4.0 MiB reserved (0.0% of cuda:0)'
    """
    mib = 2**20
    peak, reserved = capture["peak_allocated_bytes"], capture.get("peak_reserved_bytes")
    total = capture.get("device_total_bytes")
    if str(capture.get("device")).startswith("cpu"):
        line = f"memory peak {peak / mib:,.1f} MiB resident (the whole process, peak RSS)"
    else:
        line = f"memory peak {peak / mib:,.1f} MiB allocated"
        if reserved is not None:
            line += f", {reserved / mib:,.1f} MiB reserved"
        if total:
            line += f" ({100.0 * (reserved or peak) / total:.1f}% of {capture['device']})"
    largest = batch.get("largest_batch")
    shown = f"{largest:,}" if isinstance(largest, int) else "no estimate"
    return (
        f"{line}; largest batch that fits: {shown} (confidence {batch['confidence']}), "
        f"{capture['wall_time_s']:.1f} s"
    )


@contextlib.contextmanager
def kept_state(model: Any, say: Callable[[str], None]) -> Iterator[None]:
    """The model's weights and buffers as they were before the memory passes, put back after
    them: the passes train it further, and a target shared with other code must come back
    as the timed profile left it. The copy goes to an unnamed temporary file (ours alone,
    gone when closed), so that it adds nothing to the memory measured: on the CPU, the
    process's resident memory. A state torch cannot save or load back is said, not fatal."""
    import tempfile

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
