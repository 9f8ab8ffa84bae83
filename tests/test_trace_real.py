"""Real GPU traces (recorded by other projects on a V100 and an MI300X; provenance in
tests/data/real/README.md) against Holistic Trace Analysis's numbers for them.

The ``.hta.json`` files were written by HTA 0.5.0 itself (benchmarks/hta_reference.py); the
issue's bar is agreement within 0.5 percentage points on each share.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dlci.cli import main

REAL = Path(__file__).parent / "data" / "real"
TRACES = sorted(p for p in REAL.glob("*.json") if not p.name.endswith(".hta.json"))


@pytest.mark.parametrize("trace", TRACES, ids=[p.stem for p in TRACES])
def test_temporal_breakdown_agrees_with_hta(trace: Path, tmp_path: Path) -> None:
    hta = json.loads(trace.with_suffix(".hta.json").read_text())
    out = tmp_path / "u.json"
    assert main(["analyze", str(trace), "--json", str(out), "--quiet"]) == 0
    tb = json.loads(out.read_text())["devices"][0]["temporal_breakdown"]
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
