"""The corpus of real traces (tests/data/real/, provenance and licences in its README.md):
profiler traces that other projects recorded on real NVIDIA and AMD GPUs and on CPUs, from
2020's torch 1.8 previews to 2025's.

Every trace is analysed once, in process, and its report is checked against figures
computed here independently, in plain Python from the JSON (TensorBoard's GPU utilization,
TraceLens's busy time, kernel and step counts, whether there are memory figures), and,
where the trace has one, against the number its own tool printed (``.hta.json``: Holistic
Trace Analysis 0.5.0's temporal breakdown, written by benchmarks/hta_reference.py).
"""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path
from typing import Any

import pytest

from dlci.cli import main

REAL = Path(__file__).parent / "data" / "real"
CORPUS = sorted(p for p in REAL.iterdir() if p.name.endswith((".json", ".json.gz")))
CORPUS = [p for p in CORPUS if not p.name.endswith(".hta.json")]
STEP = re.compile(r"ProfilerStep#(\d+)")
KERNEL, COPIES = {"kernel"}, {"gpu_memcpy", "gpu_memset", "memcpy", "memset"}
RUNTIME = {"cuda_runtime", "runtime", "cuda_driver"}
STEP_CATS = {"cpu_op", "operator", "user_annotation"}
HOST_WORK = re.compile(r"^(cuda|hip|cu)(Ext)?(Module)?(Launch|GraphLaunch|Mem(cpy|set))")
MARK_PHASES = {"M", "C", "s", "t", "f", "i", "I", "R"}  # metadata, counters, flows, marks
TOLERANCE_PP = 0.01  # the report rounds percentages to 4 decimals; float sums differ below


def _stem(p: Path) -> str:
    return p.name.removesuffix(".gz").removesuffix(".json")


def _union(intervals: list[tuple[float, float]], lo: float = -1e300, hi: float = 1e300) -> float:
    """Total time covered by the intervals, clipped to [lo, hi]."""
    total, end = 0.0, -1e300
    for s, e in sorted((max(s, lo), min(e, hi)) for s, e in intervals):
        if e <= s:
            continue
        if s > end:
            total += e - s
            end = e
        elif e > end:
            total += e - end
            end = e
    return total


def reference(data: Any) -> dict[str, Any]:
    """The figures the report must give, from the trace's events alone."""
    events = [e for e in (data["traceEvents"] if isinstance(data, dict) else data)]
    events = [e for e in events if isinstance(e, dict) and isinstance(e.get("ts"), int | float)]
    spans = [e for e in events if e.get("ph") == "X" and isinstance(e.get("dur"), int | float)]
    device: dict[Any, list[tuple[str, float, float, Any]]] = {}
    launches: dict[Any, float] = {}
    steps: dict[int, tuple[float, float]] = {}
    step_pids: dict[Any, list[int]] = {}
    on_stream = 0  # events HTA counts as GPU events that are not device work (see below)
    host_work = sum(
        1
        for e in spans
        if str(e.get("cat", "")).lower() in RUNTIME and HOST_WORK.match(str(e.get("name", "")))
    )
    # events with no category that are neither metadata, counters, flows nor marks
    everything = data["traceEvents"] if isinstance(data, dict) else data
    no_category = sum(
        1
        for e in everything
        if isinstance(e, dict) and not e.get("cat") and e.get("ph") not in MARK_PHASES
    )
    with_category = sum(1 for e in spans if e.get("cat"))
    for e in spans:
        cat, args = str(e.get("cat", "")).lower(), e.get("args") or {}
        if args.get("stream") not in (None, -1) and cat not in KERNEL | COPIES | {"cuda_sync"}:
            on_stream += 1
        if cat in KERNEL | COPIES:
            where = args.get("device", e.get("pid"))
            device.setdefault(where, []).append(
                (cat, e["ts"], e["ts"] + e["dur"], args.get("correlation"))
            )
        elif cat in RUNTIME and "correlation" in args:
            launches[args["correlation"]] = e["ts"]
        elif cat in STEP_CATS and (m := STEP.fullmatch(str(e.get("name", "")))):
            steps[int(m.group(1))] = (e["ts"], e["ts"] + e["dur"])
            step_pids.setdefault(e.get("pid"), []).append(int(m.group(1)))
    if len(step_pids) > 1:  # a merged trace: steps per process, none at the top
        steps = {}
    lo = min((s for s, _ in steps.values()), default=None)
    hi = max((e for _, e in steps.values()), default=None)
    if steps:  # TensorBoard: a step ends when the device work its host side launched ends
        for work in device.values():
            for _, _, end, corr in work:
                at = launches.get(corr)
                if at is not None and any(s <= at < e for s, e in steps.values()):
                    hi = max(hi, end)  # type: ignore[type-var]
    out = {}
    for where, work in device.items():
        kernels = [(s, e) for cat, s, e, _ in work if cat in KERNEL]
        first, last = min(s for _, s, _, _ in work), max(e for _, _, e, _ in work)
        out[where] = {
            "kernels": len(kernels),
            "busy_pct": 100 * _union([(s, e) for _, s, e, _ in work]) / (last - first)
            if last > first
            else None,
            "tb_pct": 100 * _union(kernels, lo, hi) / (hi - lo) if steps and hi > lo else None,  # type: ignore[operator]
        }
    if no_category > with_category:
        state = "not understood"
    elif out:
        state = "gpu"
    else:
        state = "gpu activity not recorded" if host_work else "cpu-only"
    return {
        "devices": out,
        "steps": sorted(steps),
        "processes": {p: sorted(n) for p, n in step_pids.items()} if len(step_pids) > 1 else {},
        "memory": _memory(events, spans, list(steps.values())),
        "hta_extra": on_stream,
        "state": state,
        "no_category": no_category,
    }


def _memory(
    events: list[dict[str, Any]], spans: list[dict[str, Any]], steps: list[tuple[float, float]]
) -> dict[str, Any] | None:
    """Bounds on the memory figures from the [memory] events of the accelerator with the
    highest total (torch's allocator state after each event; a running sum without totals)."""
    mem = [e for e in events if e.get("name") == "[memory]" and e.get("ph") == "i"]
    if not mem:
        return None
    by_device: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for e in mem:
        a = e.get("args") or {}
        by_device.setdefault((a.get("Device Type", 0), a.get("Device Id", -1)), []).append(e)
    gpus = [d for d in by_device if d[0] != 0] or list(by_device)
    chosen = sorted(by_device[max(gpus, key=lambda d: _level(by_device[d]))], key=lambda e: e["ts"])
    totals = [e["args"].get("Total Allocated") for e in chosen]
    if all(t is None for t in totals):  # 2021: no totals, the running sum of Bytes
        running, totals = 0, []
        for e in chosen:
            running += e["args"]["Bytes"]
            totals.append(max(running, 0))
    lo = min((s for s, _ in steps), default=-1e300)
    hi = max((e for _, e in steps), default=1e300)
    inside = [t for e, t in zip(chosen, totals, strict=True) if lo <= e["ts"] < hi]
    threads = {
        (str(e.get("pid")), str(e.get("tid")))
        for e in spans
        if str(e.get("cat", "")).lower() in STEP_CATS
    }
    return {
        "lowest_peak": max((t for t in inside if t is not None), default=None),
        "highest_peak": max(t for t in totals if t is not None),
        "ops_on_its_threads": any(
            (str(e.get("pid")), str(e.get("tid"))) in threads for e in chosen
        ),
    }


def _level(events: list[dict[str, Any]]) -> int:
    return max([(e.get("args") or {}).get("Total Allocated") or 0 for e in events])


@pytest.mark.parametrize("trace", CORPUS, ids=[_stem(p) for p in CORPUS])
def test_corpus_trace(trace: Path, tmp_path: Path) -> None:
    with (gzip.open if trace.suffix == ".gz" else open)(trace, "rt", encoding="utf-8") as f:
        expected = reference(json.load(f))
    out = tmp_path / "u.json"
    assert main(["analyze", str(trace), "--json", str(out), "--quiet"]) == 0
    report = json.loads(out.read_text())
    assert report["trace"]["state"] == expected["state"]
    assert report["trace"]["cpu_only"] is (expected["state"] == "cpu-only")
    read = report["trace"]["read"]  # every event is used, not needed, or dropped for a reason
    assert read["events"] == read["used"] + read["skipped"] + read["dropped"]
    assert read["dropped"] == sum(read["dropped_by_reason"].values())
    assert read["dropped_by_reason"]["no category"] == expected["no_category"]
    assert report["steps"]["numbers"] == expected["steps"]
    processes = {p["pid"]: p["steps"]["numbers"] for p in report.get("processes", [])}
    assert processes == expected["processes"]
    memory, want_memory = report["memory"], expected["memory"]
    assert (memory["source"] == "trace") is (want_memory is not None)
    if want_memory is not None and want_memory["lowest_peak"] is not None:
        assert want_memory["lowest_peak"] <= memory["peak_allocated_bytes"]
        assert memory["peak_allocated_bytes"] <= want_memory["highest_peak"]
    if want_memory is not None and want_memory["ops_on_its_threads"]:  # (2021: "25738" == 25738)
        assert memory["top_allocations"][0]["operator"] != "(no operator)"
    got = {d["device"]: d for d in report["devices"]}
    assert len(got) == len(expected["devices"])
    for where, want in expected["devices"].items():
        d = got[where if isinstance(where, int) else next(k for k in got if got[k]["name"])]
        assert d["kernels"]["count"] == want["kernels"], where
        if want["busy_pct"] is not None:
            assert abs(d["busy"]["busy_pct"] - want["busy_pct"]) <= TOLERANCE_PP, where
        if want["tb_pct"] is not None:
            assert abs(d["gpu_utilization_pct"] - want["tb_pct"]) <= TOLERANCE_PP, where
    hta_file = REAL / (_stem(trace) + ".hta.json")
    if hta_file.exists():  # Holistic Trace Analysis's own numbers for rank 0
        hta = json.loads(hta_file.read_text())
        tb = report["devices"][0]["temporal_breakdown"]
        # HTA 0.5 takes every event with args.stream for a GPU event: GPU-side annotations
        # and a host op carrying its stream (torch.compile's triton launches) too; dlci
        # counts device work only (docs/profiling.md): where they count, only counts compare
        extra = hta["gpu_event_count"] - tb["events"]
        assert 0 <= extra <= expected["hta_extra"]
        if extra:
            return
        for key in ("idle_pct", "compute_pct", "non_compute_pct"):
            assert abs(tb[key] - hta[key]) <= 0.5, (key, tb[key], hta[key])
        assert tb["span_us"] == hta["span_us"]
        assert tb["events"] == hta["gpu_event_count"]


def test_the_2021_v100_trace(tmp_path: Path) -> None:
    out = tmp_path / "u.json"
    trace = REAL / "kineto_v100_mlp.json"
    assert main(["analyze", str(trace), "--json", str(out), "--quiet"]) == 0
    report = json.loads(out.read_text())
    assert report["trace"]["categories"]["Kernel"] == 30
    assert report["steps"]["numbers"] == [2]  # ProfilerStep#2, recorded as an Operator in 2021
    device = report["devices"][0]
    assert device["name"] is None or "V100" in device["name"]
    assert device["copies"]["h2d_pageable"]["count"] + device["copies"]["h2d_other"]["count"] == 2
    assert report["phases"]["data_loading_us"] > 0  # enumerate(DataLoader)#... as an Operator
    assert [w for w in report["warnings"] if "unknown" in w] == []


def test_the_rocm_trace_without_steps(tmp_path: Path) -> None:
    out = tmp_path / "u.json"
    trace = REAL / "tracelens_mi300x_add.json"
    assert main(["analyze", str(trace), "--json", str(out), "--quiet"]) == 0
    report = json.loads(out.read_text())
    assert report["steps"]["count"] == 0
    assert any("no ProfilerStep" in w for w in report["warnings"])
    # ten back-to-back aten::add kernels: busy all but the nanosecond gaps (TraceLens's busy)
    assert report["devices"][0]["busy"]["busy_pct"] > 99.9
    assert report["devices"][0]["kernels"]["count"] == 10
