"""Peak memory of one training step (:class:`PeakMeter`) and the device's total memory.

- on a GPU, ``torch.cuda.max_memory_allocated`` / ``max_memory_reserved`` after
  ``reset_peak_memory_stats`` before the step: exact figures of torch's caching allocator;
- on the CPU, the process's peak resident set (RSS): ``VmHWM`` of /proc/self/status, reset
  before each step by writing ``5`` to /proc/self/clear_refs (Linux 4.0+), after returning
  freed heap memory to the system (``malloc_trim``) so the step's own growth shows; where the
  reset is refused, ``VmRSS`` sampled every millisecond during the step (a peak shorter than
  that can be missed). The method says which was used.

Used by the memory pass (memcapture.py) and the batch size estimate (batchfit.py). Nothing
here imports torch at module level.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import threading
from pathlib import Path
from typing import Any

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
    """Collect garbage and give freed heap pages back (glibc), so RSS follows the step.

    What survives is frozen (``gc.freeze``): the next step's collection scans only what was
    made since, not the whole heap again (with torch and its libraries loaded a full
    collection takes 0.1 to 0.3 s, a step of a small model a few milliseconds). A frozen
    object is never freed by a collection during a step either, which keeps the step's
    rise its own. :meth:`PeakMeter.close` thaws them.
    """
    gc.collect()
    gc.freeze()
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

    def close(self) -> None:
        """Give the objects frozen by :meth:`start` back to the collector."""
        if not self.cuda:
            gc.unfreeze()

    def __enter__(self) -> PeakMeter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

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
