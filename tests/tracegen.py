"""Synthetic Kineto traces with a known geometry, for the analyzer's tests and benchmarks.

These are stand-ins for GPU traces (no GPU exists on CI): they follow the layout that
torch.profiler writes with CUDA activities (cpu_op / user_annotation on the host, a
cuda_runtime launch per kernel linked by ``args.correlation``, kernels and copies on
``pid`` = device, ``tid`` = stream, ac2g flows, ``ProfilerStep#N`` annotations), so the
numbers the tests expect can be worked out by hand from the parameters.
"""

from __future__ import annotations

import gzip
import io
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

HOST_PID = 4242
MAIN_TID = 4242
BACKWARD_TID = 4343
T0 = 1_700_000_000_000.0  # microseconds; the absolute origin of every synthetic trace


@dataclass
class Trace:
    """A list of events plus the header; ``write`` gives the file."""

    events: list[dict[str, Any]] = field(default_factory=list)
    header: dict[str, Any] = field(
        default_factory=lambda: {
            "schemaVersion": 1,
            "deviceProperties": [
                {
                    "id": 0,
                    "name": "NVIDIA H100 80GB HBM3",
                    "totalGlobalMem": 85029158912,
                    "computeMajor": 9,
                    "computeMinor": 0,
                }
            ],
            "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 1},
        }
    )
    corr: int = 1000

    # -- host
    def step(self, number: int, ts: float, dur: float, tid: int = MAIN_TID) -> None:
        self.events.append(_x("user_annotation", f"ProfilerStep#{number}", HOST_PID, tid, ts, dur))

    def op(self, name: str, ts: float, dur: float, tid: int = MAIN_TID) -> None:
        self.events.append(_x("cpu_op", name, HOST_PID, tid, ts, dur))

    def annotation(self, name: str, ts: float, dur: float, tid: int = MAIN_TID) -> None:
        self.events.append(_x("user_annotation", name, HOST_PID, tid, ts, dur))

    def runtime(
        self, name: str, ts: float, dur: float, corr: int | None = None, tid: int = MAIN_TID
    ) -> int:
        if corr is None:
            self.corr += 1
            corr = self.corr
        self.events.append(
            _x("cuda_runtime", name, HOST_PID, tid, ts, dur, {"cbid": 211, "correlation": corr})
        )
        return corr

    # -- device
    def kernel(
        self,
        name: str,
        ts: float,
        dur: float,
        *,
        launch: float | None = None,
        launch_dur: float = 4.0,
        stream: int = 7,
        device: int = 0,
        tid: int = MAIN_TID,
    ) -> int:
        """A kernel, and its cudaLaunchKernel on the host at ``launch`` (default ts - 10)."""
        launch = ts - 10.0 if launch is None else launch
        corr = self.runtime("cudaLaunchKernel", launch, launch_dur, tid=tid)
        self.events.append(
            _x(
                "kernel",
                name,
                device,
                stream,
                ts,
                dur,
                {"device": device, "stream": stream, "correlation": corr, "grid": [1, 1, 1]},
            )
        )
        self.events.append(_flow("s", corr, HOST_PID, tid, launch))
        self.events.append(_flow("f", corr, device, stream, ts))
        return corr

    def memcpy(
        self,
        kind: str,
        ts: float,
        dur: float,
        nbytes: int,
        *,
        launch: float | None = None,
        stream: int = 7,
        device: int = 0,
    ) -> int:
        """kind: 'HtoD Pageable', 'HtoD Pinned', 'DtoH Pageable', 'DtoD'."""
        names = {
            "HtoD Pageable": "Memcpy HtoD (Pageable -> Device)",
            "HtoD Pinned": "Memcpy HtoD (Pinned -> Device)",
            "DtoH Pageable": "Memcpy DtoH (Device -> Pageable)",
            "DtoH Pinned": "Memcpy DtoH (Device -> Pinned)",
            "DtoD": "Memcpy DtoD (Device -> Device)",
        }
        launch = ts - 10.0 if launch is None else launch
        corr = self.runtime("cudaMemcpyAsync", launch, 5.0)
        self.events.append(
            _x(
                "gpu_memcpy",
                names[kind],
                device,
                stream,
                ts,
                dur,
                {"device": device, "stream": stream, "correlation": corr, "bytes": nbytes},
            )
        )
        return corr

    def memset(self, ts: float, dur: float, stream: int = 7, device: int = 0) -> int:
        corr = self.runtime("cudaMemsetAsync", ts - 10.0, 3.0)
        self.events.append(
            _x(
                "gpu_memset",
                "Memset (Device)",
                device,
                stream,
                ts,
                dur,
                {"device": device, "stream": stream, "correlation": corr, "bytes": 1024},
            )
        )
        return corr

    # -- memory (torch.profiler's profile_memory=True)
    def memory(
        self,
        ts: float,
        nbytes: int,
        allocated: int,
        reserved: int,
        *,
        device: int = 0,
        device_type: int = 1,
        tid: int = MAIN_TID,
    ) -> None:
        """A synthetic ``[memory]`` instant event in the shape torch writes: ``nbytes`` allocated
        (negative: freed) on the host thread ``tid``, the CUDA caching allocator's totals just
        after it (device_type 1 is CUDA, 0 the CPU with device id -1)."""
        args = {
            "Total Reserved": reserved,
            "Total Allocated": allocated,
            "Bytes": nbytes,
            "Device Id": device,
            "Device Type": device_type,
            "Addr": 0x7F0000000000 + len(self.events) * 512,
            "finished": False,
            "Ev Idx": len(self.events),
        }
        event = {"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]"}
        self.events.append({**event, "pid": HOST_PID, "tid": tid, "ts": T0 + ts, "args": args})

    # -- output
    def iter_json(self, *, legacy: bool = False, bare: bool = False) -> Iterator[bytes]:
        """The file, as Kineto lays it out (one event per line-group), in pieces."""
        if bare:
            yield b"[\n"
        else:
            yield b"{\n"
            for key, value in self.header.items():
                yield b'  "' + key.encode() + b'": ' + msgspec.json.encode(value) + b",\n"
            yield b'  "traceEvents": [\n'
        first = True
        for event in self.events:
            if legacy:
                event = _legacy(event)
            yield (b"" if first else b",\n") + b"  " + msgspec.json.encode(event)
            first = False
        if bare:
            yield b"\n]\n"
        else:
            yield b'\n  ],\n  "traceName": "synthetic", "displayTimeUnit": "ms"\n}\n'

    def write(self, path: Path, *, legacy: bool = False, bare: bool = False) -> Path:
        data = b"".join(self.iter_json(legacy=legacy, bare=bare))
        if path.suffix == ".gz":
            data = gzip.compress(data, compresslevel=1, mtime=0)
        path.write_bytes(data)
        return path


def _x(
    cat: str,
    name: str,
    pid: int,
    tid: int,
    ts: float,
    dur: float,
    args: dict[str, Any] | None = None,
) -> dict[str, Any]:
    event: dict[str, Any] = {
        "ph": "X",
        "cat": cat,
        "name": name,
        "pid": pid,
        "tid": tid,
        "ts": T0 + ts,
        "dur": dur,
    }
    if args is not None:
        event["args"] = args
    return event


def _flow(ph: str, corr: int, pid: int, tid: int, ts: float) -> dict[str, Any]:
    event = {"ph": ph, "id": corr, "pid": pid, "tid": tid, "ts": T0 + ts, "cat": "ac2g"}
    event["name"] = "ac2g"
    if ph == "f":
        event["bp"] = "e"
    return event


LEGACY = {
    "cpu_op": "Operator",
    "user_annotation": "cpu_op",  # 2021 traces recorded ProfilerStep as an operator
    "cuda_runtime": "Runtime",
    "kernel": "Kernel",
    "gpu_memcpy": "Memcpy",
    "gpu_memset": "Memset",
}


def _legacy(event: dict[str, Any]) -> dict[str, Any]:
    if event.get("cat") in LEGACY:
        event = dict(event, cat=LEGACY[event["cat"]])
        if event["cat"] == "cpu_op":
            event["cat"] = "Operator"
    return event


def training_trace(
    *,
    steps: int = 4,
    kernels: int = 20,
    kernel_us: float = 50.0,
    launch_gap_us: float = 10.0,
    data_us: float = 100.0,
    copy_bytes: int = 1 << 20,
    pinned: bool = True,
    item_sync: bool = False,
    tiny_kernels: int = 0,
    first_step: int = 1,
) -> Trace:
    """A training loop with a fixed, hand-checkable shape.

    Each step: a DataLoader ``__next__`` of ``data_us``; one host-to-device copy of
    ``copy_bytes`` (100 us on the GPU, during which nothing else runs); forward: ``kernels``
    kernels of ``kernel_us``, launched back to back and separated on the GPU by
    ``launch_gap_us`` of idle time; backward on the autograd thread: the same; the optimizer
    step: ``kernels // 2`` kernels; with ``item_sync`` a ``loss.item()`` that waits for the
    GPU to drain. ``tiny_kernels`` adds that many 2 us kernels to the optimizer step.
    """
    trace = Trace()
    t = 0.0
    gpu_free = 0.0
    for n in range(first_step, first_step + steps):
        step_start = t
        trace.annotation(
            "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__", t, data_us
        )
        t += data_us
        # host-to-device copy of the batch
        copy_start = max(gpu_free, t + 10.0)
        trace.memcpy(
            "HtoD Pinned" if pinned else "HtoD Pageable", copy_start, 100.0, copy_bytes, launch=t
        )
        gpu_free = copy_start + 100.0
        t += 20.0
        for phase, count, tid, label, op in (
            ("forward", kernels, MAIN_TID, "dlci/forward", "aten::linear"),
            (
                "backward",
                kernels,
                BACKWARD_TID,
                "dlci/backward",
                "autograd::engine::evaluate_function: AddmmBackward0",
            ),
            ("optimizer", kernels // 2, MAIN_TID, "dlci/optimizer", "aten::add_"),
        ):
            phase_start = t
            for k in range(count + (tiny_kernels if phase == "optimizer" else 0)):
                dur = 2.0 if k >= count else kernel_us
                start = max(gpu_free + launch_gap_us, t + 10.0)
                trace.op(op, t, 8.0, tid=tid)
                trace.kernel(f"{phase}_kernel_{k % 3}", start, dur, launch=t + 2.0, tid=tid)
                gpu_free = start + dur
                t += 8.0
            trace.annotation(label, phase_start, t - phase_start, tid=tid)
        if item_sync:
            wait = max(0.0, gpu_free - t) + 5.0
            trace.op("aten::item", t, wait + 4.0)
            trace.op("aten::_local_scalar_dense", t + 1.0, wait + 2.0)
            trace.memcpy("DtoH Pageable", gpu_free, 3.0, 4, launch=t + 1.5)
            gpu_free += 3.0
            trace.runtime("cudaStreamSynchronize", t + 2.0, wait)
            t += wait + 4.0
        trace.step(n, step_start, t - step_start)
        t += 1.0
    return trace


def write_large(path: Path, target_bytes: int, *, seed_steps: int = 50) -> tuple[int, int]:
    """Write a trace of about ``target_bytes`` (uncompressed) in bounded memory.

    Repeats a ``training_trace`` block, shifted in time, until the size is reached.
    Returns (bytes written, events written).
    """
    block = training_trace(steps=seed_steps, kernels=40, item_sync=True)
    span = max(e["ts"] + e.get("dur", 0) for e in block.events) - T0 + 100.0
    header = b"".join(
        b'  "' + k.encode() + b'": ' + msgspec.json.encode(v) + b",\n"
        for k, v in block.header.items()
    )
    written = events = 0
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "wb") as raw:
        out = io.BufferedWriter(raw, buffer_size=1 << 20)
        out.write(b"{\n" + header + b'  "traceEvents": [\n')
        written += len(header) + 20
        rep = 0
        step_offset = 0
        first = True
        while written < target_bytes:
            shift = rep * span
            lines = []
            for event in block.events:
                event = dict(event, ts=event["ts"] + shift)
                if event["name"].startswith("ProfilerStep#"):
                    number = int(event["name"].split("#")[1]) + step_offset
                    event["name"] = f"ProfilerStep#{number}"
                if "args" in event and "correlation" in event["args"]:
                    event["args"] = dict(
                        event["args"], correlation=event["args"]["correlation"] + rep * 10_000_000
                    )
                if event["ph"] in ("s", "f"):
                    event["id"] = event["id"] + rep * 10_000_000
                lines.append((b"" if first else b",\n") + b"  " + msgspec.json.encode(event))
                first = False
            chunk = b"".join(lines)
            out.write(chunk)
            written += len(chunk)
            events += len(block.events)
            rep += 1
            step_offset += seed_steps
        out.write(b'\n  ],\n  "traceName": "large"\n}\n')
        out.flush()
    return written, events
