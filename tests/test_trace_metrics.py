"""The utilization metrics on hand-built traces whose numbers are worked out by hand.

The traces are synthetic stand-ins for GPU traces (no GPU on CI; tests/tracegen.py), laid
out as torch.profiler writes them. Each expected number below is derived in the comment
above it from the event times, not read back from the code.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dlci.profiling import intervals as iv
from dlci.profiling import metrics
from dlci.profiling.reader import read_trace
from tracegen import BACKWARD_TID, Trace, training_trace


def analyze(cols: Any, **given: Any) -> dict[str, Any]:
    """The report as utilization.json holds it (metrics.analyze builds its classes)."""
    return msgspec.to_builtins(metrics.analyze(cols, **given))  # type: ignore[no-any-return]


def report_of(trace: Trace, tmp_path: Path, **write: bool) -> dict:
    path = trace.write(tmp_path / "trace.json", **write)
    return analyze(read_trace(path), source=str(path))


@pytest.fixture
def simple(tmp_path: Path) -> dict:
    """One step [0, 100]; kernels [10, 30] and [20, 40] (two streams), [60, 70]; a copy [80, 90]."""
    t = Trace()
    t.step(1, 0.0, 100.0)
    t.kernel("gemm", 10.0, 20.0, launch=5.0, stream=7)
    t.kernel("gemm", 20.0, 20.0, launch=6.0, stream=8)
    t.kernel("relu", 60.0, 10.0, launch=50.0, stream=7)
    t.memcpy("HtoD Pageable", 80.0, 10.0, 1_000_000, launch=70.0)
    return report_of(t, tmp_path)


def test_tensorboard_utilization_is_kernel_union_over_the_steps(simple: dict) -> None:
    # union of kernels: [10, 40] + [60, 70] = 40 us over the step [0, 100]
    device = simple["devices"][0]
    assert device["gpu_utilization"]["kernel_us"] == 40.0
    assert device["gpu_utilization"]["window_us"] == 100.0
    assert simple["gpu_utilization_pct"] == 40.0


def test_tracelens_busy_is_kernel_copy_union_over_first_to_last(simple: dict) -> None:
    # kernels 40 + copy 10 = 50 us busy over [10, 90] = 80 us
    busy = simple["devices"][0]["busy"]
    assert (busy["busy_us"], busy["span_us"], busy["busy_pct"]) == (50.0, 80.0, 62.5)


def test_hta_temporal_breakdown(simple: dict) -> None:
    # span 80; union of all 50 -> idle 30 (37.5%); compute = kernels 40 (50%); copy 10 (12.5%)
    tb = simple["devices"][0]["temporal_breakdown"]
    assert tb["idle_pct"] == 37.5
    assert tb["compute_pct"] == 50.0
    assert tb["non_compute_pct"] == 12.5
    assert tb["idle_pct"] + tb["compute_pct"] + tb["non_compute_pct"] == pytest.approx(100.0)


def test_copies_pageable_bytes_bandwidth_and_exposed_time(simple: dict) -> None:
    pageable = simple["devices"][0]["copies"]["h2d_pageable"]
    # 1 MB in 10 us = 100 GB/s; nothing runs during the copy, so all 10 us are exposed
    assert pageable == {
        "count": 1,
        "bytes": 1_000_000,
        "time_us": 10.0,
        "bandwidth_gbps": 100.0,
        "exposed_us": 10.0,
    }
    assert simple["devices"][0]["copies"]["h2d_pinned"]["count"] == 0
    assert any(r["id"] == "pageable-copies" for r in simple["recommendations"])


def test_idle_gaps_ranked_with_cause_and_cpu_op(tmp_path: Path) -> None:
    t = Trace()
    t.step(1, 0.0, 200.0)
    t.op("aten::mm", 0.0, 15.0)
    t.kernel("a", 10.0, 10.0, launch=1.0)  # launched before the GPU was idle
    # idle [20, 100]: the next launch comes at 90, after the GPU went idle -> host-bound
    t.op("aten::slow_cpu_thing", 20.0, 70.0)
    t.kernel("b", 100.0, 10.0, launch=90.0)
    # idle [110, 130]: launched at 50, long before: the device waited on something else
    t.kernel("c", 130.0, 70.0, launch=50.0)
    report = report_of(t, tmp_path)
    gaps = report["devices"][0]["idle_gaps"]
    assert [(g["start_us"], g["duration_us"], g["cause"]) for g in gaps[:3]] == [
        (20.0, 80.0, "host"),
        (110.0, 20.0, "device"),
        (0.0, 10.0, "host"),
    ]
    assert gaps[0]["cpu_op"] == {"name": "aten::slow_cpu_thing", "overlap_us": 70.0}


def test_step_end_moves_to_the_end_of_its_device_work(tmp_path: Path) -> None:
    t = Trace()
    t.step(1, 0.0, 100.0)
    t.kernel("late", 120.0, 30.0, launch=95.0)  # launched in step 1, runs until 150
    t.step(2, 110.0, 100.0)
    t.kernel("k", 160.0, 20.0, launch=115.0)
    report = report_of(t, tmp_path)
    steps = report["per_step"]
    # step 1: [0, 150]; step 2 starts at 150 (not 110) and ends at its CPU end, 210
    assert [(s["start_us"], s["duration_us"]) for s in steps] == [(0.0, 150.0), (150.0, 60.0)]
    # utilization: kernels 30 + 20 over [0, 210]
    assert report["gpu_utilization_pct"] == pytest.approx(100 * 50 / 210, abs=1e-3)


def test_step_breakdown_priority_order(tmp_path: Path) -> None:
    t = Trace()
    t.step(1, 0.0, 100.0)
    t.annotation("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 0.0, 30.0)
    t.op("aten::copy_", 5.0, 10.0)  # inside data loading: data loading wins
    t.op("aten::linear", 40.0, 40.0)  # CPU exec [40, 80] less what the GPU and runtime cover
    t.kernel("k", 50.0, 20.0, launch=41.0, launch_dur=4.0)  # runtime [41, 45]
    report = report_of(t, tmp_path)
    b = report["per_step"][0]["breakdown"]
    # kernel [50,70] = 20; runtime [41,45] = 4; data [0,30] = 30;
    # cpu exec [40,80] less kernel and runtime = 40 - 20 - 4 = 16; other = 100 - 70 = 30
    assert b == {
        "kernel_us": 20.0,
        "memcpy_us": 0.0,
        "memset_us": 0.0,
        "communication_us": 0.0,
        "runtime_us": 4.0,
        "data_loading_us": 30.0,
        "cpu_exec_us": 16.0,
        "other_us": 30.0,
    }
    assert report["breakdown"]["pct"]["data_loading"] == 30.0


def test_phases_from_dlci_annotations_and_torch_names(tmp_path: Path) -> None:
    t = Trace()
    t.step(1, 0.0, 100.0)
    t.annotation("dlci/data", 0.0, 10.0)
    t.annotation("dlci/forward", 10.0, 30.0)
    t.op("autograd::engine::evaluate_function: MmBackward0", 40.0, 25.0, tid=BACKWARD_TID)
    t.annotation("Optimizer.step#Adam.step", 70.0, 20.0)
    report = report_of(t, tmp_path)
    assert report["per_step"][0]["phases"] == {
        "data_loading_us": 10.0,
        "optimizer_us": 20.0,
        "backward_us": 25.0,
        "forward_us": 30.0,
        "other_us": 15.0,
    }


def test_a_forward_and_backward_inside_the_optimizer_step_count_as_themselves(
    tmp_path: Path,
) -> None:
    """A closure run by ``Optimizer.step`` (Lightning's automatic optimisation, LBFGS): the
    innermost annotation wins, so the optimizer keeps only its own time. Control: the same
    phases side by side (the previous test) split by the plain priority."""
    t = Trace()
    t.step(1, 0.0, 100.0)
    t.annotation("dlci/data", 0.0, 10.0)
    t.annotation("Optimizer.step#SGD.step", 10.0, 80.0)
    t.annotation("dlci/forward", 15.0, 30.0)
    t.op("autograd::engine::evaluate_function: MmBackward0", 50.0, 25.0, tid=BACKWARD_TID)
    report = report_of(t, tmp_path)
    assert report["per_step"][0]["phases"] == {
        "data_loading_us": 10.0,
        "optimizer_us": 25.0,  # 10-15, 45-50 and 75-90: the step's own work
        "backward_us": 25.0,
        "forward_us": 30.0,
        "other_us": 10.0,
    }
    # manual optimisation: the optimizer's step runs inside the training step's annotation
    t = Trace()
    t.step(1, 0.0, 100.0)
    t.annotation("dlci/forward", 0.0, 90.0)
    t.annotation("dlci/backward", 40.0, 30.0)
    t.annotation("Optimizer.step#SGD.step", 75.0, 10.0)
    (tmp_path / "manual").mkdir()
    phases = report_of(t, tmp_path / "manual")["per_step"][0]["phases"]
    assert (phases["forward_us"], phases["backward_us"], phases["optimizer_us"]) == (
        50.0,
        30.0,
        10.0,
    )


def test_sync_inventory_names_the_blocking_op(tmp_path: Path) -> None:
    t = Trace()
    for n in (1, 2):
        base = (n - 1) * 1000.0
        t.step(n, base, 900.0)
        t.kernel("k", base + 20.0, 500.0, launch=base + 5.0)
        t.op("aten::item", base + 100.0, 430.0)
        t.op("aten::_local_scalar_dense", base + 101.0, 428.0)
        t.runtime("cudaMemcpyAsync", base + 102.0, 3.0)
        t.runtime("cudaStreamSynchronize", base + 105.0, 415.0)
    t.runtime("cudaDeviceSynchronize", 1950.0, 10.0)  # outside any op
    report = report_of(t, tmp_path)
    syncs = report["syncs"]
    assert syncs["count"] == 3
    assert syncs["wait_us"] == 840.0
    assert syncs["blocking_ops"] == 2  # aten::item around _local_scalar_dense counts once
    assert syncs["blocking_ops_per_step"] == 1.0
    top = syncs["by_call"][0]
    assert (top["call"], top["caller"], top["count"], top["wait_us"]) == (
        "cudaStreamSynchronize",
        "aten::item",
        2,
        830.0,
    )
    assert syncs["by_call"][1]["caller"] == "(no op)"
    assert any(r["id"] == "syncs" for r in report["recommendations"])


def test_launch_overhead_and_tiny_kernels(tmp_path: Path) -> None:
    t = Trace()
    t.step(1, 0.0, 1000.0)
    for i in range(8):
        t.kernel("tiny", 100.0 + 10 * i, 2.0, launch=20.0 + 10 * i, launch_dur=6.0)
    t.kernel("big", 300.0, 100.0, launch=200.0, launch_dur=6.0)
    t.kernel("big", 500.0, 100.0, launch=400.0, launch_dur=6.0)
    report = report_of(t, tmp_path)
    launches = report["launches"]
    assert launches["launch_calls"]["count"] == 10
    assert launches["launch_calls"]["median_us"] == 6.0
    assert launches["launch_delay"]["median_us"] == 80.0  # every kernel starts 80-100 us later
    assert launches["tiny_kernels"] == 8
    assert launches["tiny_kernels_pct"] == 80.0
    assert launches["tiny_kernel_time_pct"] == pytest.approx(100 * 16 / 216, abs=1e-3)
    # utilization 216 / 1000 < 50% and 80% tiny kernels: launch-bound
    assert any(r["id"] == "tiny-kernels" for r in report["recommendations"])


def test_communication_kernels_are_not_compute(tmp_path: Path) -> None:
    t = Trace()
    t.step(1, 0.0, 100.0)
    t.kernel("sm90_gemm", 0.0, 40.0, launch=0.0)
    t.kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 40.0, 60.0, launch=1.0, stream=20)
    report = report_of(t, tmp_path)
    tb = report["devices"][0]["temporal_breakdown"]
    assert (tb["compute_pct"], tb["non_compute_pct"], tb["idle_pct"]) == (40.0, 60.0, 0.0)
    assert report["per_step"][0]["breakdown"]["communication_us"] == 60.0
    assert report["devices"][0]["kernels"]["communication_count"] == 1


def test_two_devices_are_reported_separately(tmp_path: Path) -> None:
    t = Trace()
    t.step(1, 0.0, 100.0)
    t.kernel("a", 0.0, 80.0, launch=0.0, device=0)
    t.kernel("b", 0.0, 20.0, launch=0.0, device=1)
    report = report_of(t, tmp_path)
    assert [d["gpu_utilization_pct"] for d in report["devices"]] == [80.0, 20.0]
    assert report["primary_device"] == 0


def test_training_loop_shape(tmp_path: Path) -> None:
    """The tracegen loop: numbers that follow from its documented parameters."""
    report = report_of(training_trace(steps=3, kernels=4, item_sync=True), tmp_path)
    assert report["steps"]["count"] == 3
    # per step: 4 + 4 + 2 kernels of 50 us on the GPU
    assert report["devices"][0]["kernels"]["count"] == 30
    assert report["devices"][0]["kernels"]["time_us"] == 30 * 50.0
    assert report["devices"][0]["copies"]["h2d_pinned"]["count"] == 3
    assert report["syncs"]["by_call"][0]["caller"] == "aten::item"
    assert report["warnings"] == []


def test_cpu_only_trace_warns_and_still_breaks_down(tmp_path: Path) -> None:
    t = Trace()
    t.step(1, 0.0, 100.0)
    t.op("aten::mm", 10.0, 50.0)
    report = report_of(t, tmp_path)
    assert report["gpu_utilization_pct"] is None
    assert report["devices"] == []
    assert report["trace"]["cpu_only"] is True
    assert any("CPU-only" in w for w in report["warnings"])
    assert report["per_step"][0]["breakdown"]["cpu_exec_us"] == 50.0


def test_no_step_markers_uses_the_whole_trace(tmp_path: Path) -> None:
    t = Trace()
    t.kernel("k", 10.0, 40.0, launch=0.0)
    report = report_of(t, tmp_path)
    assert any("no ProfilerStep" in w for w in report["warnings"])
    assert report["steps"]["count"] == 0
    # window: from the launch at 0 to the kernel's end at 50
    assert report["gpu_utilization_pct"] == 80.0


def test_cuda_graph_and_cut_short_warnings(tmp_path: Path) -> None:
    t = Trace()
    t.step(1, 0.0, 100.0)
    t.kernel("k", 10.0, 10.0, launch=0.0)
    t.runtime("cudaGraphLaunch", 30.0, 5.0)
    t.step(2, 100.0, 100.0)
    t.runtime("cudaLaunchKernel", 150.0, 4.0)  # its kernel never made it into the trace
    report = report_of(t, tmp_path)
    text = " ".join(report["warnings"])
    assert "CUDA graph" in text
    assert "ProfilerStep#2" in text and "cut short" in text


def test_nanosecond_timestamps_are_converted(tmp_path: Path) -> None:
    t = Trace()
    t.step(1, 0.0, 100.0)
    t.kernel("k", 10.0, 50.0, launch=0.0)
    for event in t.events:  # nanoseconds since the epoch, as some exporters write
        event["ts"] = (event["ts"] + 1.79e15) * 1000
        if "dur" in event:
            event["dur"] *= 1000
    report = report_of(t, tmp_path)
    # float64 holds nanoseconds since the epoch to about 0.5 us: close, not exact
    assert report["gpu_utilization_pct"] == pytest.approx(50.0, abs=1.0)
    assert any("nanoseconds" in w for w in report["warnings"])


def test_events_without_duration_and_unknown_categories(tmp_path: Path) -> None:
    t = Trace()
    t.step(1, 0.0, 100.0)
    t.kernel("k", 10.0, 50.0, launch=0.0)
    t.events.append({"ph": "X", "cat": "kernel", "name": "nodur", "pid": 0, "tid": 7, "ts": 1.0})
    t.events.append({"ph": "X", "cat": "mystery", "name": "m", "pid": 1, "tid": 1, "ts": 1.0})
    report = report_of(t, tmp_path)
    assert report["gpu_utilization_pct"] == 50.0
    text = " ".join(report["warnings"])
    assert "1 events have no duration" in text
    assert "mystery (1)" in text


def test_legacy_2021_categories_give_the_same_numbers(tmp_path: Path) -> None:
    trace = training_trace(steps=3, kernels=4, item_sync=True)
    new = report_of(trace, tmp_path)
    old_path = trace.write(tmp_path / "old.json", legacy=True)
    old = analyze(read_trace(old_path))
    assert old["trace"]["categories"].get("Kernel") == 30
    for key in ("gpu_utilization_pct", "breakdown", "syncs", "steps"):
        assert old[key] == new[key], key


# ---------------------------------------------------------------------------- intervals


def _brute(intervals: list[tuple[int, int]]) -> set[int]:
    return {t for s, e in intervals for t in range(s, e)}


interval_lists = st.lists(
    st.tuples(st.integers(0, 60), st.integers(0, 20)).map(lambda p: (p[0], p[0] + p[1])),
    max_size=12,
)


@settings(max_examples=200, deadline=None)
@given(interval_lists, interval_lists, st.integers(0, 80), st.integers(0, 80))
def test_union_and_priority_match_brute_force(a, b, lo, hi) -> None:
    lo, hi = min(lo, hi), max(lo, hi)
    sa = iv.merge(np.array([s for s, _ in a], float), np.array([e for _, e in a], float))
    sb = iv.merge(np.array([s for s, _ in b], float), np.array([e for _, e in b], float))
    ua, ub = _brute(a), _brute(b)
    window = set(range(lo, hi))
    assert iv.length(*sa) == len(ua)
    assert iv.length(*iv.clip(*sa, lo, hi)) == len(ua & window)
    assert iv.clipped_lengths(*sa, [lo], [hi]).tolist() == [len(ua & window)]
    split = iv.priority_split((lo, hi), [("a", sa), ("b", sb)])
    assert split == {
        "a": len(ua & window),
        "b": len((ub - ua) & window),
        "other": len(window - ua - ub),
    }
    many = iv.priority_lengths([lo], [hi], [("a", sa), ("b", sb)])
    assert {k: v.tolist()[0] for k, v in many.items()} == split
    gs, ge = iv.gaps(*sa, lo, hi)
    assert iv.length(gs, ge) == len(window - ua)
