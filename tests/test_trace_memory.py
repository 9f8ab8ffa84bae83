"""The utilization report's memory section, from the ``[memory]`` events of Kineto traces.

Real CPU traces (tests/data/memory, recorded by record.py there) plant one allocation of a
known size in a known phase by a known op; a trace recorded here, now, checks the same
against the installed torch and its own per-op figures. Synthetic CUDA traces (tracegen)
take the GPU path: device totals from deviceProperties, the caching allocator's reserved
bytes, the autograd thread. Hostile memory events are skipped and counted, never refused.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dlci.cli import main
from dlci.profiling import memcols, metrics, reader
from dlci.profiling.memory import NO_OPERATOR, enclosing_ops, memory_section
from dlci.profiling.reader import read_trace
from dlci.report.fields import Gate
from dlci.report.utilization import read, render_markdown
from tracegen import BACKWARD_TID, HOST_PID, MAIN_TID, T0, Trace, training_trace


def analyze(cols: Any, **given: Any) -> dict[str, Any]:
    """The report as utilization.json holds it (metrics.analyze builds its classes)."""
    return msgspec.to_builtins(metrics.analyze(cols, **given))  # type: ignore[no-any-return]


DATA = Path(__file__).parent / "data" / "memory"
EXPECTED = json.loads((DATA / "expected.json").read_text())
PLANT = 8 << 20  # record.py's PLANT_BYTES
GIB, MIB = 1 << 30, 1 << 20
H100_TOTAL = 85029158912  # tracegen's deviceProperties


def _record_module() -> Any:
    spec = importlib.util.spec_from_file_location("dlci_memory_record", DATA / "record.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _section(path: Path) -> dict[str, Any]:
    return msgspec.to_builtins(memory_section(read_trace(path)))  # type: ignore[no-any-return]


# ------------------------------------------------------------------ real CPU traces


@pytest.mark.parametrize(
    ("name", "phase", "operator"),
    [
        ("cpu_plant_forward", "forward", "aten::mul"),
        ("cpu_plant_optimizer", "optimizer", "aten::add"),
    ],
)
def test_the_planted_allocation_sets_the_peak_phase_and_the_top_operator(
    name: str, phase: str, operator: str
) -> None:
    assert EXPECTED["traces"][name]["planted_nbytes"] == PLANT
    memory = _section(DATA / f"{name}.json.gz")
    assert memory["source"] == "trace" and memory["device"] == "cpu"
    # the plant moves both: forward -> optimizer, aten::mul -> aten::add (the control)
    assert memory["peak_phase"] == phase
    assert [s["peak_phase"] for s in memory["steps"]] == [phase, phase]
    assert [s["step"] for s in memory["steps"]] == [2, 3]
    # the planted tensor on top of a small model's few KiB
    assert PLANT <= memory["peak_allocated_bytes"] < PLANT + 64 * 1024
    top = memory["top_allocations"][0]
    assert top == {"operator": operator, "bytes": 2 * PLANT, "count": 2}  # 2 profiled steps
    assert len(memory["top_allocations"]) <= 10
    # the CPU allocator reserves nothing; there is no device total on the CPU
    assert memory["peak_reserved_bytes"] is None
    assert memory["device_total_bytes"] is None and memory["peak_percent_of_device"] is None
    assert "CPU" in memory["note"]


@pytest.mark.parametrize("name", ["cpu_plant_forward", "cpu_plant_optimizer"])
def test_attribution_matches_torchs_own_per_op_memory(name: str) -> None:
    """Every allocation and free, given to the innermost op around it, sums per op to what
    torch's key_averages() says (self CPU memory, recorded beside the trace)."""
    cols = read_trace(DATA / f"{name}.json.gz")
    _check_against_torch(cols, EXPECTED["traces"][name]["self_cpu_memory_by_op"])


def _check_against_torch(cols: Any, torch_net: dict[str, int]) -> None:
    mem = cols.memory
    owners = enclosing_ops(cols, mem.pid, mem.tid, mem.ts)
    net: dict[str, int] = {}
    for owner, size in zip(owners.tolist(), mem.bytes.tolist(), strict=True):
        key = cols.names[owner] if owner >= 0 else NO_OPERATOR
        net[key] = net.get(key, 0) + size
    # annotations (record_function) are not operators here; torch's table lists them too
    ops = {k for k in set(net) | set(torch_net) if k.startswith("aten::")}
    assert ops and {k: net.get(k, 0) for k in ops} == {k: torch_net.get(k, 0) for k in ops}


def test_a_trace_recorded_now_with_the_installed_torch(tmp_path: Path) -> None:
    record = _record_module()
    said = record.record("now", "optimizer", out=tmp_path)
    cols = read_trace(tmp_path / "now.json.gz")
    memory = msgspec.to_builtins(memory_section(cols))
    assert memory["peak_phase"] == "optimizer"
    assert memory["top_allocations"][0]["operator"] == "aten::add"
    assert memory["top_allocations"][0]["bytes"] == 2 * said["planted_nbytes"]
    _check_against_torch(cols, said["self_cpu_memory_by_op"])


def test_a_trace_without_memory_events_says_so_and_how_to_record_them(tmp_path: Path) -> None:
    out = tmp_path / "u.json"
    markdown = tmp_path / "u.md"
    trace = DATA / "cpu_no_memory.json.gz"
    assert (
        main(["analyze", str(trace), "--json", str(out), "--markdown", str(markdown), "--quiet"])
        == 0
    )
    memory = json.loads(out.read_text())["memory"]
    assert memory["source"] == "none"
    assert memory["peak_allocated_bytes"] is None and memory["top_allocations"] == []
    assert "no [memory] events" in memory["note"] and "profile_memory=True" in memory["note"]
    text = markdown.read_text()
    assert "#### Memory" in text and "profile_memory=True" in text


def test_the_real_gpu_traces_have_no_memory_events() -> None:
    for path in sorted((DATA.parent / "real").glob("*.json")):
        if not path.name.endswith(".hta.json"):
            assert _section(path)["source"] == "none"


def test_the_markdown_section(tmp_path: Path) -> None:
    report = analyze(read_trace(DATA / "cpu_plant_forward.json.gz"))
    text = render_markdown(read(report))
    section = text[text.index("#### Memory") :]
    assert "| peak phase | forward |" in section
    assert "| `aten::mul` | 16.0 MiB (16,777,216 bytes) | 2 |" in section
    assert "| step | peak allocated | peak reserved | peak phase |" in section
    # a report written before the section existed renders as before
    del report["memory"]
    assert "#### Memory" not in render_markdown(read(report))


# ------------------------------------------------------------------ synthetic CUDA traces


def _op(trace: Trace, step: int, name: str) -> float:
    """The middle of the first op called ``name`` in step ``step``."""
    span = next(e for e in trace.events if e["name"] == f"ProfilerStep#{step}")
    lo, hi = span["ts"], span["ts"] + span["dur"]
    found = min(e["ts"] for e in trace.events if e["name"] == name and lo <= e["ts"] < hi)
    return found - T0 + 4.0  # ops last 8 us


def gpu_trace(plant_in: str = "backward", *, scale: float = 1.0) -> Trace:
    """Three steps on cuda:0: 1 GiB before them (parameters), per step 100 MiB in forward
    (aten::linear), 3 GiB planted in ``plant_in``'s first op, 4 KiB while loading data (no
    op), everything but the parameters freed in the optimizer phase; step 3 allocates
    nothing. The CPU holds more (10 GiB) but the figures are the GPU's."""
    trace = training_trace(steps=3, kernels=4)
    ops = {
        "forward": ("aten::linear", MAIN_TID),
        "backward": ("autograd::engine::evaluate_function: AddmmBackward0", BACKWARD_TID),
    }
    level, reserved = GIB, 2 * GIB
    trace.memory(-50.0, GIB, level, reserved)
    trace.memory(-40.0, 10 * GIB, 10 * GIB, 0, device=-1, device_type=0)
    for step in (1, 2):
        first = next(e for e in trace.events if e["name"] == f"ProfilerStep#{step}")
        for size, (name, tid) in (
            (4096, (None, MAIN_TID)),
            (100 * MIB, ops["forward"]),
            (3 * GIB, ops[plant_in]),
        ):
            at = first["ts"] - T0 + 5.0 if name is None else _op(trace, step, name)
            level += size
            reserved = max(reserved, level + GIB)
            trace.memory(at, size, level, reserved, tid=tid)
        trace.memory(_op(trace, step, "aten::add_"), GIB - level, GIB, reserved)
        level = GIB
    if scale != 1.0:  # nanoseconds since the epoch: every time, memory events' too
        for event in trace.events:
            event["ts"] = event["ts"] * scale + 1e17
            if "dur" in event:
                event["dur"] = event["dur"] * scale
    return trace


def test_the_gpu_path(tmp_path: Path) -> None:
    memory = _section(gpu_trace().write(tmp_path / "gpu.json.gz"))
    peak = GIB + 100 * MIB + 3 * GIB + 4096
    assert memory["device"] == "cuda:0"  # not the CPU, though it holds more
    assert memory["peak_allocated_bytes"] == peak
    assert memory["peak_reserved_bytes"] == peak + GIB
    assert memory["device_total_bytes"] == H100_TOTAL
    assert memory["peak_percent_of_device"] == round(100 * (peak + GIB) / H100_TOTAL, 4)
    assert memory["peak_phase"] == "backward"
    steps = memory["steps"]
    assert [s["step"] for s in steps] == [1, 2, 3]
    assert [s["peak_phase"] for s in steps[:2]] == ["backward", "backward"]
    # step 3 allocates nothing: its peak is the level it began with
    assert steps[2]["peak_allocated_bytes"] == GIB and steps[2]["peak_phase"] == "optimizer"
    assert memory["top_allocations"] == [
        {
            "operator": "autograd::engine::evaluate_function: AddmmBackward0",
            "bytes": 6 * GIB,
            "count": 2,
        },
        {"operator": "aten::linear", "bytes": 200 * MIB, "count": 2},
        {"operator": NO_OPERATOR, "bytes": 8192, "count": 2},
    ]  # the parameters' 1 GiB came before the profiled steps
    assert "cpu" in memory["note"]


def test_the_gpu_path_control_plant_in_forward(tmp_path: Path) -> None:
    memory = _section(gpu_trace("forward").write(tmp_path / "gpu.json.gz"))
    assert memory["peak_phase"] == "forward"
    assert memory["top_allocations"][0]["operator"] == "aten::linear"


def test_nanosecond_timestamps_move_the_memory_events_too(tmp_path: Path) -> None:
    plain = _section(gpu_trace().write(tmp_path / "us.json"))
    scaled = _section(gpu_trace(scale=1000.0).write(tmp_path / "ns.json"))
    assert scaled == plain


def test_no_device_total_without_device_properties(tmp_path: Path) -> None:
    trace = gpu_trace()
    trace.header["deviceProperties"] = [{"id": 0, "totalGlobalMem": "80GB"}]
    memory = _section(trace.write(tmp_path / "gpu.json"))
    assert memory["device_total_bytes"] is None and memory["peak_percent_of_device"] is None
    assert memory["peak_allocated_bytes"] is not None


def test_the_report_carries_the_section(tmp_path: Path) -> None:
    report = analyze(read_trace(gpu_trace().write(tmp_path / "gpu.json")))
    assert report["memory"]["device"] == "cuda:0"
    assert report["memory"]["capture"] is None and report["memory"]["batch_estimate"] is None
    assert "| peak, % of device |" in render_markdown(read(report))


# ------------------------------------------------------------------ hostile input


def _memory_event(ts: Any, args: Any, **extra: Any) -> dict[str, Any]:
    event = {"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]"}
    return {**event, "pid": HOST_PID, "tid": MAIN_TID, "ts": ts, "args": args, **extra}


GOOD = {"Bytes": 64, "Total Allocated": 64, "Total Reserved": 0, "Device Type": 1, "Device Id": 0}
BAD_ARGS = [
    {**GOOD, "Bytes": "x"},
    {**GOOD, "Bytes": 2**70},
    {**GOOD, "Bytes": 1.5},
    {**GOOD, "Total Allocated": -5},
    {**GOOD, "Device Id": 2**40},
    {k: v for k, v in GOOD.items() if k != "Bytes"},
    [1, 2],
]


@pytest.mark.parametrize("typed", [True, False], ids=["fast path", "event by event"])
def test_odd_memory_events_are_skipped_and_counted(tmp_path: Path, typed: bool) -> None:
    trace = gpu_trace()
    base = T0 + 1.0
    odd: list[dict[str, Any]] = [_memory_event(base, args) for args in BAD_ARGS]
    odd += [_memory_event("nan", GOOD), _memory_event(123456789.5, GOOD)]  # ts 1e400 below
    if typed:  # only what decodes as typed events: the range checks alone refuse them
        odd = [
            _memory_event(base, {**GOOD, "Total Allocated": -5}),
            _memory_event(base, {**GOOD, "Device Id": 2**40}),
            _memory_event(base, {k: v for k, v in GOOD.items() if k != "Bytes"}),
            _memory_event(None, GOOD),
        ]
    trace.events += odd
    path = tmp_path / "odd.json"
    path.write_bytes(b"".join(trace.iter_json()).replace(b"123456789.5", b"1e400"))
    cols = read_trace(path)
    assert cols.memory.skipped == len(odd)
    memory = msgspec.to_builtins(memory_section(cols))
    assert (
        memory["peak_allocated_bytes"]
        == _section(gpu_trace().write(tmp_path / "ok.json"))["peak_allocated_bytes"]
    )
    assert f"{len(odd)} [memory] events" in memory["note"]


def test_only_unreadable_memory_events(tmp_path: Path) -> None:
    trace = Trace()
    trace.step(1, 0.0, 100.0)
    trace.events += [_memory_event(T0 + 5.0, args) for args in BAD_ARGS]
    memory = _section(trace.write(tmp_path / "bad.json"))
    assert memory["source"] == "none"
    assert f"none of the trace's {len(BAD_ARGS)} [memory] events" in memory["note"]


def test_a_huge_total_is_left_out_of_the_peaks_only(tmp_path: Path) -> None:
    trace = gpu_trace()
    at = _op(trace, 1, "aten::linear") + 1.0
    trace.events.append(_memory_event(T0 + at, {**GOOD, "Total Allocated": 10**30}))
    memory = _section(trace.write(tmp_path / "huge.json"))
    assert memory["peak_allocated_bytes"] == GIB + 100 * MIB + 3 * GIB + 4096
    assert {"operator": "aten::linear", "bytes": 200 * MIB + 64, "count": 3} in memory[
        "top_allocations"
    ]


def test_2021_memory_events_without_category_or_totals(tmp_path: Path) -> None:
    """The TensorBoard plugin's era: no ``cat``, only Bytes, Addr and the device."""
    trace = Trace()
    trace.step(1, 0.0, 100.0)
    trace.op("aten::empty", 10.0, 10.0)
    for ts, size in ((12.0, 4096), (14.0, 1024), (30.0, -4096)):
        args = {"Device Type": 0, "Device Id": -1, "Addr": 90, "Bytes": size}
        event = {"ph": "i", "s": "t", "name": "[memory]", "pid": HOST_PID, "tid": MAIN_TID}
        trace.events.append({**event, "ts": T0 + ts, "args": args})
    memory = _section(trace.write(tmp_path / "old.json"))
    assert memory["peak_allocated_bytes"] == 5120
    assert memory["top_allocations"] == [{"operator": "aten::empty", "bytes": 5120, "count": 2}]
    assert "running sum" in memory["note"]


def test_memory_columns_are_flushed_into_numpy_chunks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Held as Python lists only up to FLUSH_EVENTS events: memory stays bounded."""
    monkeypatch.setattr(memcols, "FLUSH_EVENTS", 50)
    monkeypatch.setattr(reader, "BLOCK", 4096)  # slices of a few dozen events
    held: list[int] = []
    original = memcols.MemoryBuilder.flush

    def flush(self: memcols.MemoryBuilder) -> None:
        held.append(len(self.lists[0]))
        original(self)

    monkeypatch.setattr(memcols.MemoryBuilder, "flush", flush)
    trace = Trace()
    trace.step(1, 0.0, 5000.0)
    for i in range(1000):
        trace.memory(float(i), 8, 8 * (i + 1), 4096 * (i // 100 + 1))
    memory = _section(trace.write(tmp_path / "many.json"))
    assert 0 < max(held) <= 100  # the limit plus one slice; all 1000 without the flush
    assert memory["peak_allocated_bytes"] == 8000 and memory["peak_reserved_bytes"] == 40960


def test_the_markdown_shows_the_combined_gate_and_the_profiles_own_figures(tmp_path: Path) -> None:
    report = analyze(read_trace(gpu_trace().write(tmp_path / "gpu.json")))
    report["memory"]["capture"] = {
        "device": "cuda:0",
        "method": "torch.cuda.max_memory_allocated per step",
        "peak_allocated_bytes": 3 * GIB,
        "peak_reserved_bytes": 4 * GIB,
        "device_total_bytes": H100_TOTAL,
    }
    report["memory"]["batch_estimate"] = {
        "batch_size": 32,
        "largest_batch": 512,
        "confidence": "two consistent points",
        "advice": "raise the batch size",
        "method": "a line through two batch sizes",
    }
    gate = {
        "passed": False,
        "minimum": None,
        "value": None,
        "message": "x",
        "checks": [{"name": "max-gpu-memory", "passed": False, "message": "GPU peak 95%"}],
    }
    text = render_markdown(read(report), gate=msgspec.convert(gate, Gate))
    assert "**Gate FAILED**" in text and "- max-gpu-memory: FAILED: GPU peak 95%" in text
    assert "largest batch that fits: about 512" in text and "peak reserved 4.0 GiB" in text
    assert "**Advice**: raise the batch size" in text


# ------------------------------------------------- hostile input: sizes, totals, many threads


@pytest.mark.parametrize(
    "total",
    [0, -1, "80GB", True, 1.5e10, 1e400, memcols.MAX_BYTES + 1, 1000],
    ids=["zero", "negative", "string", "bool", "float", "1e400", "over 1 PiB", "below the peak"],
)
def test_a_bogus_device_total_gives_a_note_not_a_percentage(tmp_path: Path, total: Any) -> None:
    trace = gpu_trace()
    trace.header["deviceProperties"] = [
        {"id": False, "totalGlobalMem": H100_TOTAL},  # False == 0 in Python: not device 0
        {"id": 0, "totalGlobalMem": 123456789.5},
    ]
    path = tmp_path / "bogus.json"
    text = b"".join(trace.iter_json()).replace(b"123456789.5", json.dumps(total).encode())
    path.write_bytes(text.replace(b"1e+400", b"1e400"))
    memory = _section(path)
    assert memory["peak_allocated_bytes"] == GIB + 100 * MIB + 3 * GIB + 4096  # still there
    assert memory["device_total_bytes"] is None and memory["peak_percent_of_device"] is None
    assert "totalGlobalMem" in memory["note"] and "no percentage of the device" in memory["note"]
    # control: the same trace with the real total has a percentage and no such note
    good = _section(gpu_trace().write(tmp_path / "good.json"))
    assert good["peak_percent_of_device"] is not None and "totalGlobalMem" not in good["note"]


def test_absurd_byte_counts_are_left_out(tmp_path: Path) -> None:
    """No allocator holds a petabyte: Bytes beyond it skip the event, a total beyond it
    leaves the event out of the peaks (counted in the note); no 9e18% of the device."""
    trace = gpu_trace()
    at = T0 + _op(trace, 1, "aten::linear") + 1.0
    trace.events += [
        _memory_event(at, {**GOOD, "Bytes": 2**63 - 1, "Total Allocated": 2**62}),
        _memory_event(at, {**GOOD, "Total Allocated": 2**62, "Total Reserved": 2**62}),
    ]
    memory = _section(trace.write(tmp_path / "absurd.json"))
    peak = GIB + 100 * MIB + 3 * GIB + 4096
    assert memory["peak_allocated_bytes"] == peak and memory["peak_reserved_bytes"] == peak + GIB
    assert memory["peak_percent_of_device"] < 100
    assert "1 [memory] events with missing, odd or out-of-range fields" in memory["note"]
    assert "1 [memory] events without a readable 'Total Allocated'" in memory["note"]
    assert all(row["bytes"] < memcols.MAX_BYTES for row in memory["top_allocations"])


def test_memory_events_after_every_step_say_why_there_are_no_peaks(tmp_path: Path) -> None:
    trace = Trace()
    trace.step(1, 0.0, 100.0)
    trace.memory(500.0, 64, 64, 128)  # after the only step: no level to start from
    memory = _section(trace.write(tmp_path / "late.json"))
    assert memory["source"] == "trace" and memory["peak_allocated_bytes"] is None
    assert "none of the 1 [memory] events of cuda:0 comes before the end" in memory["note"]
    trace.memory(50.0, 64, 64, 128)  # control: one inside the step
    assert _section(trace.write(tmp_path / "in.json"))["peak_allocated_bytes"] == 64


def _innermost_by_hand(cols: Any, pid: int, tid: int, ts: float) -> int:
    """The reference: the op on the thread covering ``ts`` that started last (the longer on
    a tie of starts, as the sort does), else -1."""
    best, key = -1, None
    for i in range(cols.op_ts.size):
        mine = cols.op_pid[i] == pid and cols.op_tid[i] == tid and not cols.op_annotation[i]
        if mine and cols.op_ts[i] <= ts <= cols.op_end[i]:
            k = (cols.op_ts[i], -cols.op_end[i])
            if key is None or k > key:
                best, key = int(cols.op_name[i]), k
    return best


def test_many_threads_and_devices_in_one_pass(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hostile trace with an event on each of many threads and devices: the ops are sorted
    once for all threads (not once per thread, which was quadratic: 80,000 threads took 17 s),
    the answers match a by-hand search, and the note names a few devices, not all."""
    import numpy as np

    from dlci.profiling import memory as memory_module

    trace = Trace()
    trace.step(1, 0.0, 10_000.0)
    threads = 300
    for t in range(threads):
        trace.op("aten::outer", 10.0 * t, 8.0, tid=1000 + t)
        trace.op("aten::inner", 10.0 * t + 2.0, 2.0, tid=1000 + t)
        for dt in (1.0, 3.0, 6.0, 9.0):  # in outer, in inner, in outer again, after both
            trace.memory(10.0 * t + dt, 8, 8, 16, tid=1000 + t, device=t % 40)
    cols = read_trace(trace.write(tmp_path / "threads.json"))
    calls = []
    original = memory_module._parents
    monkeypatch.setattr(memory_module, "_parents", lambda *a: calls.append(1) or original(*a))
    mem = cols.memory
    found = enclosing_ops(cols, mem.pid, mem.tid, mem.ts)
    assert len(calls) == 1  # one sort for every thread
    expected = [
        _innermost_by_hand(cols, int(p), int(t), float(s))
        for p, t, s in zip(mem.pid, mem.tid, mem.ts, strict=True)
    ]
    assert found.tolist() == expected
    names = [cols.names[i] if i >= 0 else None for i in found[:4].tolist()]
    assert names == ["aten::outer", "aten::inner", "aten::outer", None]
    assert (np.asarray(expected) >= 0).sum() == 3 * threads
    note = memory_section(cols).note
    assert "cuda:1, cuda:2, cuda:3, cuda:4, cuda:5 and 34 more" in note


def test_the_console_line_says_what_a_cpu_figure_counts() -> None:
    """torch's CPU totals start with profiling: the console must not pass them off as the
    process's memory (dlci profile's own line beside it gives the resident memory)."""
    from dlci.profiling.analysis import summary_lines

    cpu = [line for line in summary_lines(metrics.analyze(read_trace(DATA / "cpu_plant_forward.json.gz")))
           if line.startswith("memory on cpu")]  # fmt: skip
    assert len(cpu) == 1 and "not the whole process" in cpu[0]


def test_the_console_line_of_a_gpu_trace_has_no_cpu_caveat(tmp_path: Path) -> None:
    from dlci.profiling.analysis import summary_lines

    report = analyze(read_trace(gpu_trace().write(tmp_path / "gpu.json")))
    line = next(x for x in summary_lines(read(report)) if x.startswith("memory on cuda:0"))
    assert "not the whole process" not in line and "% of the device" in line


def test_a_trace_of_memory_events_only(tmp_path: Path) -> None:
    """No steps, no ops: the peak over the whole trace, and the note says so."""
    trace = Trace()
    for i in range(1, 6):
        trace.memory(float(i), 100, 100 * i, 200 * i)
    memory = _section(trace.write(tmp_path / "only.json"))
    assert memory["peak_allocated_bytes"] == 500 and memory["steps"] == []
    assert "no ProfilerStep markers: the peak is over the whole trace" in memory["note"]
    assert memory["top_allocations"] == [{"operator": NO_OPERATOR, "bytes": 500, "count": 5}]
    trace.step(1, 0.0, 10.0)  # control: with a step the note does not say so
    assert "ProfilerStep" not in (_section(trace.write(tmp_path / "step.json"))["note"] or "")


# --------------------------------------------- foreign [memory] events of every shape (issue 32)

_THREAD = st.sampled_from([7, "7", 8, "8", "07", "stream 7", -1, None])
_NUMBER = st.one_of(
    st.integers(-(2**63), 2**63 - 1),
    st.integers(-10, 10**10),
    # finite only: NaN and Infinity are not JSON, and a trace with them is refused with a
    # located error (tests/test_trace_reader.py), never read
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=3),
    st.none(),
    st.booleans(),
)
_MEMORY_ARGS = st.fixed_dictionaries(
    {},
    optional={
        key: _NUMBER
        for key in ("Bytes", "Total Allocated", "Total Reserved", "Device Type", "Device Id")
    },
)
_REAL_ARGS = st.fixed_dictionaries(  # as torch writes them: mostly these
    {"Bytes": st.integers(-(10**9), 10**10), "Device Type": st.sampled_from([0, 1, 1, 1])},
    optional={
        "Total Allocated": st.integers(0, 10**11),
        "Total Reserved": st.integers(0, 10**11),
        "Device Id": st.sampled_from([-1, 0, 0, 1]),
    },
)
# the shapes of the corpus's memory events: 2021's (no category, integer tid, no totals),
# today's (cpu_instant_event, totals), AMD's (device type 1 for HIP too), then anything
_MEMORY_EVENT = st.fixed_dictionaries(
    {
        "ph": st.sampled_from(["i", "i", "i", "I", "X"]),
        "cat": st.sampled_from(["", "cpu_instant_event", "Memory"]),
        "name": st.just("[memory]"),
        "pid": st.sampled_from([1, "1", 2]),
        "tid": _THREAD,
        "ts": st.one_of(st.integers(0, 200), st.integers(0, 200), st.floats(-5, 205), st.none()),
        "args": st.one_of(
            _REAL_ARGS, _REAL_ARGS, _REAL_ARGS, _MEMORY_ARGS, st.none(), st.just([1])
        ),
    }
)
_OP = st.fixed_dictionaries(
    {
        "ph": st.just("X"),
        "cat": st.sampled_from(["cpu_op", "Operator", "user_annotation"]),
        "name": st.sampled_from(["aten::empty", "ProfilerStep#1", "ProfilerStep#2", "aten::add"]),
        "pid": st.sampled_from([1, "1"]),
        "tid": _THREAD,
        "ts": st.integers(0, 150),
        "dur": st.integers(0, 100),
    }
)


@settings(max_examples=60, deadline=None)
@given(st.lists(_OP, max_size=8), st.lists(_MEMORY_EVENT, min_size=1, max_size=30))
def test_foreign_memory_events_of_any_shape_give_a_memory_section(
    ops: list[dict[str, Any]], memory: list[dict[str, Any]]
) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "t.json"
        path.write_text(json.dumps({"traceEvents": ops + memory}, allow_nan=False))
        section = analyze(read_trace(path))["memory"]
    assert section["source"] in ("trace", "none")
    for key in ("peak_allocated_bytes", "peak_reserved_bytes"):
        assert section[key] is None or 0 <= section[key] <= memcols.MAX_BYTES * 31
    assert all(row["bytes"] > 0 and row["count"] > 0 for row in section["top_allocations"])
    json.dumps(section)  # serialisable: no numpy leftovers
