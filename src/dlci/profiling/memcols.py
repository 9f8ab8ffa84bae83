"""The ``[memory]`` instant events of a trace, as numpy columns.

torch.profiler with ``profile_memory=True`` writes one instant event (``ph`` ``"i"``, name
``[memory]``, category ``cpu_instant_event``; no category in 2021-era traces) for every
allocation and every free, on the host thread that made it. Its ``args`` hold ``Bytes``
(negative for a free), ``Total Allocated`` and ``Total Reserved`` (the allocator's figures
just after it), ``Device Type`` (c10's DeviceType: 0 CPU, 1 CUDA, also for ROCm's HIP) and
``Device Id`` (-1 for the CPU). :class:`MemoryBuilder` keeps ts, thread, bytes, the totals
and the device of each one, as the trace reader's other columns do (Python lists moved into
numpy chunks every ``FLUSH_EVENTS`` events: about 40 bytes an event).

An event that cannot be read is skipped and counted (``MemoryColumns.skipped``), never
refused: no time or no ``Bytes``, a time that is not a finite number within ``MAX_TIME``, a
``Bytes`` beyond ``MAX_BYTES`` either way, a total below -1, a device type or id out of range.
A missing total is kept as -1, and so is one beyond ``MAX_BYTES`` (no allocator holds a
petabyte: such a total is not a figure to report).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dlci.profiling.events import Args, Event

MEMORY_NAME = "[memory]"
# categories a [memory] event comes with: current traces, 2021-era ones (none), older names
MEMORY_CATEGORIES = frozenset({"cpu_instant_event", "", "Memory", "memory"})
FLUSH_EVENTS = 200_000
MAX_TIME = 1e19  # as the other columns (dlci.profiling.columns.MAX_TIME)
MAX_BYTES = 1 << 50  # 1 PiB: more than any one device's (or host's) memory
# ts, tid, pid, bytes, total allocated, total reserved, device type, device id
TYPES = ("float64", "int64", "int64", "int64", "int64", "int64", "int16", "int32")
CPU, CUDA = 0, 1
DEVICE_TYPES = {0: "cpu", 1: "cuda", 6: "hip", 12: "xpu", 13: "mps", 19: "mtia", 20: "privateuse1"}


@dataclass
class MemoryColumns:
    """One numpy array per field of the trace's ``[memory]`` events, in trace order."""

    ts: Any
    tid: Any
    pid: Any
    bytes: Any
    allocated: Any  # -1: the event had no "Total Allocated"
    reserved: Any  # -1: the event had no "Total Reserved"
    device_type: Any
    device_id: Any
    skipped: int = 0  # [memory] events left out: fields missing, odd or out of range

    @classmethod
    def empty(cls) -> MemoryColumns:
        import numpy as np

        return cls._of([np.empty(0, dtype=t) for t in TYPES])

    @classmethod
    def _of(cls, arrays: list[Any], skipped: int = 0) -> MemoryColumns:
        ts, tid, pid, nbytes, allocated, reserved, kind, index = arrays
        return cls(ts, tid, pid, nbytes, allocated, reserved, kind, index, skipped)

    @property
    def size(self) -> int:
        return int(self.ts.size)


def device_label(device_type: int, device_id: int) -> str:
    """``cuda:0``, ``cpu``, ``xpu:1``: the name torch gives the device.

    >>> device_label(1, 0), device_label(0, -1), device_label(99, 2)
    ('cuda:0', 'cpu', 'device-type-99:2')
    """
    name = DEVICE_TYPES.get(device_type, f"device-type-{device_type}")
    return name if device_type == CPU else f"{name}:{device_id}"


class MemoryBuilder:
    """[memory] events in, :class:`MemoryColumns` out (see the module docstring)."""

    def __init__(self) -> None:
        self.lists: tuple[list[Any], ...] = tuple([] for _ in TYPES)
        self.chunks: list[list[Any]] = [[] for _ in TYPES]
        self.skipped = 0

    def add(self, group: list[Event], threads: Callable[[list[Any]], list[int]]) -> int:
        """Keep the [memory] events of ``group`` (events of one category); ``threads`` maps
        pids and tids to the integers of the other columns. Ranges are checked in
        :meth:`flush`, on whole columns. Returns how many [memory] events ``group`` held."""
        found = [e for e in group if e.name == MEMORY_NAME and e.ph in ("i", "I")]
        if not found:
            return 0
        good = [e for e in found if e.ts is not None and e.args and e.args.mem_bytes is not None]
        self.skipped += len(found) - len(good)
        args: list[Args] = [e.args for e in good]  # type: ignore[misc]  # just checked
        ts, tid, pid, nbytes, allocated, reserved, kind, index = self.lists
        ts.extend([e.ts for e in good])
        tid.extend(threads([e.tid for e in good]))
        pid.extend(threads([e.pid for e in good]))
        nbytes.extend([a.mem_bytes for a in args])
        allocated.extend([-1 if a.mem_allocated is None else a.mem_allocated for a in args])
        reserved.extend([-1 if a.mem_reserved is None else a.mem_reserved for a in args])
        kind.extend([CPU if a.mem_device_type is None else a.mem_device_type for a in args])
        index.extend([-1 if a.mem_device_id is None else a.mem_device_id for a in args])
        if len(ts) > FLUSH_EVENTS:
            self.flush()
        return len(found)

    def flush(self) -> None:
        """Move the lists into numpy chunks, leaving out (and counting) the events with a
        time that is not finite or beyond ``MAX_TIME``, a negative total (-1: none given),
        a device type or id out of range."""
        import numpy as np

        if not self.lists[0]:
            return
        wide = [
            np.asarray(v, dtype="float64" if i == 0 else "int64") for i, v in enumerate(self.lists)
        ]
        ts, _, _, nbytes, allocated, reserved, kind, index = wide
        with np.errstate(invalid="ignore"):
            keep = np.abs(ts) <= MAX_TIME  # False for NaN
        keep &= (nbytes >= -MAX_BYTES) & (nbytes <= MAX_BYTES)
        keep &= (allocated >= -1) & (reserved >= -1)
        allocated[allocated > MAX_BYTES] = -1
        reserved[reserved > MAX_BYTES] = -1
        keep &= (kind >= 0) & (kind < 2**15) & (index >= -1) & (index < 2**31)
        self.skipped += int(keep.size - np.count_nonzero(keep))
        for values, array, chunk, dtype in zip(self.lists, wide, self.chunks, TYPES, strict=True):
            chunk.append(array[keep].astype(dtype))
            values.clear()

    def columns(self) -> MemoryColumns:
        import numpy as np

        self.flush()
        out = [
            np.concatenate(chunk) if chunk else np.empty(0, dtype=dtype)
            for chunk, dtype in zip(self.chunks, TYPES, strict=True)
        ]
        for chunk in self.chunks:
            chunk.clear()
        return MemoryColumns._of(out, self.skipped)
