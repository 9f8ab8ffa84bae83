"""The CLI under hostile input: traces, reports and output paths from hypothesis.

Every example runs ``dlci`` in a child process under RLIMIT_AS and RLIMIT_CPU (fuzzchild.py)
and must answer exit 0, 1 or 2, with at most one error line and no traceback. The profile
(``ci`` by default, ``nightly`` with HYPOTHESIS_PROFILE) sets how many examples run.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import math
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fuzzchild import assert_clean, run_dlci
from hypothesis import given
from hypothesis import strategies as st

CATEGORIES = [
    "kernel",
    "gpu_memcpy",
    "gpu_memset",
    "cuda_runtime",
    "cpu_op",
    "user_annotation",
    "cuda_sync",
    "Kernel",
    "Runtime",
    "gpu_user_annotation",
    "ac2g",
    "python_function",
]
HOSTILE_TEXT = st.one_of(
    st.text(max_size=30),
    st.sampled_from(
        [
            "::error::pwned",
            "\x1b[31mred",
            "a|b<script>",
            "x\ny\r\nz",
            "# h",
            "ProfilerStep#1",
            "ProfilerStep#²",
            "ProfilerStep#" + "9" * 5000,
            "},{",
            '"]}',
            "\x00\x07",
        ]
    ),
)
HUGE = st.one_of(
    st.integers(),
    st.integers(min_value=2**63 - 2, max_value=2**63 + 2),
    st.sampled_from([10**400, -(10**400), 2**64, -(2**63) - 1]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([1e308, -1e308, 1.7e18, 5e-324, 0.0, -1.0]),
    st.sampled_from(["nan", "inf", "-inf", "1e400", "12", "x", None, True]),
)


def _deep(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


NESTED = st.sampled_from([5, 100, 990, 5000]).map(_deep)
EVENT = st.fixed_dictionaries(
    {
        "ph": st.sampled_from(["X", "X", "X", "i", "s", "f", "M"]),
        "cat": st.one_of(st.sampled_from(CATEGORIES), HOSTILE_TEXT),
        "name": st.one_of(HOSTILE_TEXT, HUGE),
        "pid": st.one_of(st.integers(0, 3), HUGE, HOSTILE_TEXT),
        "tid": st.one_of(st.integers(0, 3), HUGE, HOSTILE_TEXT),
        "ts": st.one_of(st.floats(0, 1e6), HUGE),
        "dur": st.one_of(st.floats(0, 1e3), HUGE),
    },
    optional={
        "args": st.fixed_dictionaries(
            {},
            optional={
                "device": HUGE,
                "stream": HUGE,
                "correlation": HUGE,
                "bytes": HUGE,
                "deep": NESTED,
            },
        )
    },
)


def _encode(value: Any) -> bytes:
    """JSON as a hostile writer would: NaN and Infinity allowed, huge integers as digits."""
    import sys

    was = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(0)  # a global of the process: put back, other tests rely on it
    try:
        return json.dumps(value, allow_nan=True).encode()
    except (RecursionError, ValueError):
        return b'{"traceEvents": []}'
    finally:
        sys.set_int_max_str_digits(was)


TRACE = st.one_of(
    st.lists(EVENT, max_size=12).map(lambda events: _encode({"traceEvents": events})),
    st.lists(EVENT, max_size=12).map(_encode),  # the bare-array form
    st.binary(max_size=200),
    st.tuples(st.lists(EVENT, min_size=1, max_size=6), st.integers(0, 400)).map(
        lambda pair: _encode({"traceEvents": pair[0]})[: pair[1]]  # cut short
    ),
    st.integers(100, 3000).map(  # nesting in the header, the array, an event
        lambda n: b'{"a":' + b"[" * n + b"]" * n + b',"traceEvents":[{"x":' + b"{" * n
    ),
)


@contextlib.contextmanager
def _workdir() -> Iterator[Path]:
    """A fresh directory per example, removed after it (kept when the example fails)."""
    work = Path(tempfile.mkdtemp(prefix="dlci-fuzz-"))
    yield work
    shutil.rmtree(work, ignore_errors=True)


@given(trace=TRACE, compressed=st.booleans())
def test_analyze_any_trace(trace: bytes, compressed: bool) -> None:
    with _workdir() as work:
        path = work / ("t.json.gz" if compressed else "t.json")
        path.write_bytes(gzip.compress(trace) if compressed else trace)
        answer = run_dlci(["analyze", str(path), "--json", "-"], cwd=work, what="trace (analyze)")
        assert_clean(answer)
        if answer.code == 0:  # a report: every share finite or null
            report = json.loads(answer.stdout)
            assert "nan" not in answer.stderr.lower().replace("nanosecond", "")
            _finite(report)


def _finite(value: Any) -> None:
    if isinstance(value, float):
        assert math.isfinite(value), value
    elif isinstance(value, dict):
        for item in value.values():
            _finite(item)
    elif isinstance(value, list):
        for item in value:
            _finite(item)


JSON_VALUE = st.recursive(
    st.one_of(st.none(), st.booleans(), HUGE, st.text(max_size=10)),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)
UTILIZATION = st.fixed_dictionaries(
    {
        "kind": st.sampled_from(["utilization", "utilization", "memorization", 1]),
        "schema_version": st.sampled_from([1, 1, 1, 2, "1", None]),
    },
    optional={
        "gpu_utilization_pct": st.one_of(st.floats(0, 100), JSON_VALUE),
        "steps": st.one_of(
            st.fixed_dictionaries(
                {}, optional={"mean_step_us": st.one_of(st.floats(1, 1e6), JSON_VALUE)}
            ),
            JSON_VALUE,
        ),
        "phases": st.one_of(st.just({"pct": {"data_loading": 5.0}}), JSON_VALUE),
        "syncs": st.one_of(st.just({"per_step": 2}), JSON_VALUE),
    },
)
MEMORIZATION = st.fixed_dictionaries(
    {
        "kind": st.sampled_from(["memorization", "memorization", "utilization"]),
        "schema_version": st.sampled_from([1, 1, 1, 2]),
    },
    optional={
        "config": st.one_of(
            st.dictionaries(st.text(max_size=8), JSON_VALUE, max_size=4),
            JSON_VALUE,
            NESTED.map(lambda v: {"deep": v}),
        ),
        **{
            key: JSON_VALUE
            for key in ("verdict", "best_loss", "best_step", "final_loss", "steps", "wall_time_s")
        },
    },
)


SANE_UTILIZATION = st.fixed_dictionaries(
    {
        "kind": st.just("utilization"),
        "schema_version": st.just(1),
        "gpu_utilization_pct": st.floats(0, 100),
        "steps": st.fixed_dictionaries({"mean_step_us": st.floats(0, 1e9)}),
    }
)
SANE_RUN = st.fixed_dictionaries(
    {
        "kind": st.just("memorization"),
        "schema_version": st.just(1),
        "config": st.dictionaries(HOSTILE_TEXT, st.one_of(st.integers(-5, 5), HOSTILE_TEXT)),
        "verdict": HOSTILE_TEXT,
        "best_loss": st.floats(0, 1e300),
        "steps": st.integers(0, 2**63 - 1),
    }
)
UTILIZATION = st.one_of(SANE_UTILIZATION, UTILIZATION)
MEMORIZATION = st.one_of(SANE_RUN, MEMORIZATION)


@given(base=UTILIZATION, head=UTILIZATION, raw=st.sampled_from([False, False, False, True]))
def test_compare_profiles_any_reports(base: dict, head: dict, raw: bool) -> None:
    with _workdir() as work:
        (work / "base.json").write_bytes(_encode(base))
        (work / "head.json").write_bytes(_encode(head) if raw is False else os.urandom(50))
        answer = run_dlci(
            ["compare-profiles", "base.json", "head.json"],
            cwd=work,
            what="report (compare-profiles)",
        )
        assert_clean(answer)


@given(a=MEMORIZATION, b=MEMORIZATION)
def test_compare_runs_any_runs(a: dict, b: dict) -> None:
    with _workdir() as work:
        (work / "a.json").write_bytes(_encode(a))
        (work / "b.json").write_bytes(_encode(b))
        answer = run_dlci(
            ["compare-runs", "a.json", "b.json"], cwd=work, what="report (compare-runs)"
        )
        assert_clean(answer)


TRACE_OK = json.dumps(
    {
        "traceEvents": [
            {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 10, "dur": 5},
            {
                "ph": "X",
                "cat": "user_annotation",
                "name": "ProfilerStep#1",
                "pid": 1,
                "tid": 1,
                "ts": 0,
                "dur": 20,
            },
        ]
    }
)
OUTPUTS = st.sampled_from(
    [
        "new",
        "existing",
        "directory",
        "fifo",
        "chardev",
        "link-to-chardev",
        "under-a-file",
        "deep/new/dir",
        "-",
        "dangling-link",
        "name\nwith\x1bcontrols",
    ]
)


def _make(work: Path, kind: str) -> tuple[str, int | None]:
    """The --json argument for ``kind``, and the file type it must keep (None: anything)."""
    path = work / "out"
    if kind == "existing":
        path.write_text("old")
    elif kind == "directory":
        path.mkdir()
        return str(path), stat.S_IFDIR
    elif kind == "fifo":
        os.mkfifo(path)
        return str(path), stat.S_IFIFO
    elif kind in ("chardev", "link-to-chardev"):
        if os.geteuid() != 0:
            os.mkfifo(path)  # without root, a FIFO stands for the device
            return str(path), stat.S_IFIFO
        node = work / "null"
        os.mknod(node, stat.S_IFCHR | 0o666, os.makedev(1, 5))  # /dev/zero: /dev/null is allowed
        if kind == "chardev":
            return str(node), stat.S_IFCHR
        path.symlink_to(node)
        return str(path), stat.S_IFCHR
    elif kind == "under-a-file":
        path.write_text("x")
        return str(path / "report.json"), None
    elif kind == "dangling-link":
        path.symlink_to(work / "nowhere")
    elif kind in ("-", "deep/new/dir"):
        return kind if kind == "-" else str(work / kind / "r.json"), None
    elif "\n" in kind:
        return str(work / kind), None
    return str(path), None


@given(kind=OUTPUTS, verb=st.sampled_from(["analyze", "compare-profiles"]))
def test_output_paths(kind: str, verb: str) -> None:
    with _workdir() as work:
        (work / "t.json").write_text(TRACE_OK)
        dest, keeps = _make(work, kind)
        if verb == "analyze":
            args = ["analyze", "t.json", "--json", dest]
        else:
            report = {"kind": "utilization", "schema_version": 1, "gpu_utilization_pct": 50.0}
            (work / "u.json").write_text(json.dumps(report))
            args = ["compare-profiles", "u.json", "u.json", "--json", dest]
        answer = run_dlci(args, cwd=work, what=f"output path ({kind!r})")
        assert_clean(answer)
        if keeps is not None:
            probe = dest if kind != "link-to-chardev" else str(work / "null")
            assert stat.S_IFMT(os.stat(probe).st_mode) == keeps, kind
            assert answer.code == 1 and "dl-ci writes only regular files" in answer.stderr
