"""The streaming trace reader: layouts, cut points, and every kind of bad input."""

from __future__ import annotations

import contextlib
import gzip
import json
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dlci.errors import DlciError
from dlci.profiling import metrics, reader
from dlci.profiling.reader import read_trace
from tracegen import Trace, training_trace


def analyze(cols: Any, **given: Any) -> dict[str, Any]:
    """The report as utilization.json holds it (metrics.analyze builds its classes)."""
    return msgspec.to_builtins(metrics.analyze(cols, **given))  # type: ignore[no-any-return]


def small_trace() -> Trace:
    return training_trace(steps=3, kernels=4, item_sync=True)


def summary(cols: reader.Columns) -> tuple:
    return (
        cols.events,
        int(cols.dev_kind.size),
        int(cols.rt_ts.size),
        int(cols.op_ts.size),
        len(cols.steps),
        float(cols.dev_end.sum()),
    )


@pytest.fixture
def expected(tmp_path: Path) -> tuple:
    return summary(read_trace(small_trace().write(tmp_path / "ref.json")))


@pytest.mark.parametrize(
    "layout",
    ["kineto-gz", "pretty", "compact", "bare-array", "trailer-metadata", "crlf-bom"],
)
def test_layouts_read_the_same(tmp_path: Path, expected: tuple, layout: str) -> None:
    trace = small_trace()
    doc = {**trace.header, "traceEvents": trace.events}
    path = tmp_path / "t.json"
    if layout == "kineto-gz":
        path = trace.write(tmp_path / "t.json.gz")
    elif layout == "pretty":
        path.write_text(json.dumps(doc, indent=2))
    elif layout == "compact":
        path.write_text(json.dumps(doc, separators=(",", ":")))
    elif layout == "bare-array":
        path.write_text(json.dumps(trace.events))
    elif layout == "trailer-metadata":
        # traceEvents first, and an array of objects after it (with "}]" inside)
        path.write_text(
            json.dumps({"traceEvents": trace.events, "deviceProperties": [{"id": 0}], "x": "}]"})
        )
    elif layout == "crlf-bom":
        path.write_bytes(b"\xef\xbb\xbf" + json.dumps(doc, indent=1).replace("\n", "\r\n").encode())
    assert summary(read_trace(path)) == expected


def test_tiny_blocks_and_braces_inside_strings(tmp_path: Path, monkeypatch, expected) -> None:
    """Cut points that fall inside strings are found and skipped, whatever the block size."""
    trace = small_trace()
    for event in trace.events:
        if event.get("cat") == "cpu_op":
            event["args"] = {"Concrete Inputs": ['}, {"ph": "X"}', "}\n,\n{"]}
    path = trace.write(tmp_path / "t.json")
    for block in (64, 333, 4096):
        monkeypatch.setattr(reader, "BLOCK", block)
        assert summary(read_trace(path)) == expected


def test_header_and_device_names_are_kept(tmp_path: Path) -> None:
    cols = read_trace(small_trace().write(tmp_path / "t.json.gz"))
    assert cols.header["deviceProperties"][0]["name"] == "NVIDIA H100 80GB HBM3"
    assert cols.header["traceName"] == "synthetic"  # from after the events
    assert cols.compressed is True


def test_odd_field_types_fall_back_to_coercion(tmp_path: Path) -> None:
    t = Trace()
    t.step(1, 0.0, 100.0)
    t.kernel("k", 10.0, 50.0, launch=0.0)
    kernel = next(e for e in t.events if e["cat"] == "kernel")
    kernel["args"]["correlation"] = str(kernel["args"]["correlation"])  # a string, not an int
    kernel["tid"] = "stream 7"
    t.events.append({"ph": "X", "cat": "cpu_op", "name": 12, "ts": "oops", "dur": None})
    cols = read_trace(t.write(tmp_path / "t.json"))
    assert cols.untyped_slices >= 1
    report = analyze(cols)
    assert report["gpu_utilization_pct"] == 50.0
    assert report["launches"]["launch_delay"]["count"] == 1  # the string correlation still links
    assert cols.missing_timestamp == 1


def write(tmp_path: Path, name: str, data: bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


@pytest.mark.parametrize(
    ("name", "data", "message"),
    [
        ("empty.json", b"", "the file is empty"),
        ("blank.json", b"  \n ", "the file is empty"),
        ("number.json", b"42", "not a Kineto/Chrome trace"),
        ("object.json", b'{"hello": "world"}', "JSON without a traceEvents array"),
        ("invalid.json", b'{"hello": ', "not valid JSON"),
        ("binary.json", bytes(range(256)) * 4, "not a Kineto/Chrome trace"),
        ("cut.json", b'{"traceEvents": [{"ph": "X", "cat": "kernel", "ts": 1', "not valid JSON"),
        ("cut2.json", b'{"traceEvents": [{"ph": "X"}, {"ph": "X"}', "not valid JSON"),
        ("garbage-inside.json", b'{"traceEvents": [{"ph": "X"}, nope]}', "not valid JSON"),
    ],
)
def test_bad_files_give_one_clear_error(tmp_path: Path, name: str, data: bytes, message: str):
    with pytest.raises(DlciError) as info:
        read_trace(write(tmp_path, name, data))
    assert message in str(info.value)
    assert name in str(info.value)


def test_truncated_gzip(tmp_path: Path) -> None:
    blob = gzip.compress(b"".join(small_trace().iter_json()))
    path = write(tmp_path, "t.json.gz", blob[: len(blob) // 2])
    with pytest.raises(DlciError, match="truncated"):
        read_trace(path)


def test_corrupt_gzip(tmp_path: Path) -> None:
    blob = bytearray(gzip.compress(b"".join(small_trace().iter_json())))
    blob[40:60] = b"\x00" * 20
    with pytest.raises(DlciError, match=r"decompress|truncated|not valid JSON"):
        read_trace(write(tmp_path, "t.json.gz", bytes(blob)))


def test_missing_file_and_directory(tmp_path: Path) -> None:
    with pytest.raises(DlciError, match="no such trace file"):
        read_trace(tmp_path / "nope.json")
    with pytest.raises(DlciError, match="is a directory"):
        read_trace(tmp_path)


def test_gzip_bomb_stops_at_the_size_limit(tmp_path: Path) -> None:
    # 64 MiB of spaces inside a valid trace compress to about 64 KiB
    with gzip.open(tmp_path / "bomb.json.gz", "wb") as out:
        out.write(b'{"traceEvents": [')
        for _ in range(64):
            out.write(b" " * (1 << 20))
        out.write(b"]}")
    with pytest.raises(DlciError, match="GiB once decompressed"):
        read_trace(tmp_path / "bomb.json.gz", max_size=16 << 20)


def test_header_without_events_is_bounded(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(reader, "MAX_HEADER", 1 << 16)
    path = write(tmp_path, "t.json", b'{"a": "' + b"x" * (1 << 18) + b'"}')
    with pytest.raises(DlciError, match="no traceEvents array in its first"):
        read_trace(path)


@pytest.mark.parametrize(
    ("text", "why"),
    [
        (b'{"traceEvents": []}', "its traceEvents array is empty"),
        (b"[]", "the JSON array is empty"),
        (b"[1, 2.5, 3]", "the JSON array holds 3 values and no event object"),
        (b'{"traceEvents": [1, "a", null, []]}', "its traceEvents array holds 4 values and no"),
        (b'{"traceEvents": [{}]}', r"its traceEvents array holds 1 object and none has a phase"),
        (b'[{"name": "a"}, {"ts": 1}]', r"the JSON array holds 2 objects and none has a phase"),
    ],
)
def test_no_event_object_is_not_a_trace(tmp_path: Path, text: bytes, why: str) -> None:
    # not "analysed" into an empty report with exit 0: a located exit 1
    with pytest.raises(DlciError, match="t.json: not a Kineto/Chrome trace: " + why):
        read_trace(write(tmp_path, "t.json", text))


def test_one_event_object_among_other_values_is_read(tmp_path: Path) -> None:
    text = b'[1, {"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur": 2, "pid": 0}, "x"]'
    assert read_trace(write(tmp_path, "t.json", text)).dev_ts.size == 1


event_strategy = st.fixed_dictionaries(
    {
        "ph": st.sampled_from(["X", "X", "X", "i", "s", "f", "M"]),
        "cat": st.sampled_from(
            [
                "kernel",
                "Kernel",
                "gpu_memcpy",
                "gpu_memset",
                "cuda_runtime",
                "cpu_op",
                "user_annotation",
                "cuda_sync",
                "ac2g",
                "weird",
                "",
            ]
        ),
        "name": st.sampled_from(
            [
                "ProfilerStep#1",
                "ProfilerStep#2",
                "ProfilerStep#x",
                "aten::item",
                "cudaLaunchKernel",
                "cudaStreamSynchronize",
                "Memcpy HtoD (Pageable -> Device)",
                "nccl",
                "}, {",
                "",
            ]
        ),
        "pid": st.one_of(st.integers(-2, 3), st.sampled_from(["Spans", "0"])),
        "tid": st.one_of(st.integers(-2, 9), st.text(max_size=3)),
        "ts": st.one_of(
            st.floats(-1e3, 1e6), st.integers(0, 10**6), st.none(), st.text(max_size=2)
        ),
        "dur": st.one_of(st.floats(0, 1e4), st.none(), st.just(-5), st.just("7")),
    },
    optional={
        "args": st.fixed_dictionaries(
            {},
            optional={
                "correlation": st.one_of(st.integers(-1, 5), st.text(max_size=2)),
                "device": st.one_of(st.integers(0, 2), st.none()),
                "stream": st.integers(0, 9),
                "bytes": st.one_of(st.integers(0, 10**6), st.floats(0, 10)),
            },
        )
    },
)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(event_strategy, min_size=1, max_size=40))
def test_generated_traces_never_crash(tmp_path: Path, events: list) -> None:
    path = tmp_path / "gen.json"
    path.write_text(json.dumps({"traceEvents": events}))
    report = analyze(read_trace(path))
    for device in report["devices"]:
        tb = device["temporal_breakdown"]
        for key in ("idle_pct", "compute_pct", "non_compute_pct"):
            assert -1e-6 <= tb[key] <= 100 + 1e-6 or tb["span_us"] <= 0
    json.dumps(report)  # serialisable, no numpy leftovers


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.binary(max_size=300))
def test_garbage_bytes_give_dlci_errors_only(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "garbage.json"
    path.write_bytes(b'{"traceEvents": [' + data)
    with contextlib.suppress(DlciError):  # a clear error is fine; anything else fails
        analyze(read_trace(path))


@pytest.mark.parametrize("token", ["NaN", "Infinity", "-Infinity"])
def test_a_bare_nan_or_infinity_is_named_as_such(tmp_path: Path, token: str) -> None:
    # what Python's json.dump writes by default for a float('nan') in an event's args
    events = [
        {"ph": "X", "name": "a", "ts": 1, "dur": 2, "pid": 1, "tid": 1},
        {"ph": "i", "name": "[memory]", "ts": 3, "pid": 1, "tid": 1, "args": {"Bytes": 0}},
    ]
    text = json.dumps({"traceEvents": events}).replace('"Bytes": 0', f'"Bytes": {token}')
    (tmp_path / "t.json").write_text(text)
    with pytest.raises(DlciError, match=f"a bare {token} value") as info:
        read_trace(tmp_path / "t.json")
    assert "allow_nan=False" in (info.value.hint or "")
    # control: a name that merely says NaN is a string, and reads
    (tmp_path / "ok.json").write_text(json.dumps({"traceEvents": [{**events[0], "name": token}]}))
    read_trace(tmp_path / "ok.json")
