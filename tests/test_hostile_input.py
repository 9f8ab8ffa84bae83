"""Hostile input that must cost nothing: bounded reads, linear parsing, located errors,
outputs only onto regular files, a closed pipe ended quietly. Each protection has a control
case showing the test would catch its absence."""

from __future__ import annotations

import gzip
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from dlci.cli import main
from dlci.errors import DlciError
from dlci.fsutil import atomic_write_bytes, read_input
from dlci.profiling import reader

sys.path.insert(0, str(Path(__file__).parent / "fuzz"))
from fuzzchild import assert_clean, run_dlci

KERNEL = {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 10, "dur": 5}
STEP = {
    "ph": "X",
    "cat": "user_annotation",
    "name": "ProfilerStep#1",
    "pid": 1,
    "tid": 1,
    "ts": 0,
    "dur": 20,
}


def trace(tmp_path: Path, *events: dict, raw: bytes | None = None) -> str:
    path = tmp_path / "t.json"
    path.write_bytes(
        raw if raw is not None else json.dumps({"traceEvents": [STEP, *events]}).encode()
    )
    return str(path)


# ------------------------------------------------------------------ 1. bounded input


@pytest.mark.parametrize("verb", ["analyze", "compare-profiles", "compare-runs"])
def test_a_device_is_refused_before_a_byte_is_read(verb: str, capsys) -> None:
    args = [verb, "/dev/zero"] + ([] if verb == "analyze" else ["/dev/zero"])
    assert main(args) == 1
    err = capsys.readouterr().err
    assert "/dev/zero: not a regular file (a character device)" in err


def test_a_fifo_does_not_block(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    answer = run_dlci(["compare-profiles", str(fifo), str(fifo)], cwd=tmp_path, cpu=30)
    assert_clean(answer)
    assert answer.code == 1 and "not a regular file (a FIFO)" in answer.stderr
    assert answer.seconds < 60  # the child's wall clock is cut at 120 s: a block would show


def test_the_size_cap_and_its_control(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    path.write_bytes(b"x" * 11)
    assert read_input(path, what="file", limit=11) == b"x" * 11  # control: at the cap
    with pytest.raises(DlciError, match="more than the 10 bytes dl-ci reads as a file"):
        read_input(path, what="file", limit=10)


# ------------------------------------------------------------------ 2. the trace reader


def _bomb(tmp_path: Path, events: int, size: int) -> Path:
    """Events whose names are strings full of '},{' (valid JSON), gzipped."""
    event = (
        b'{"ph":"X","cat":"kernel","name":"'
        + b"},{" * (size // 3)
        + b'","ts":1,"dur":1,"pid":0,"tid":7}'
    )
    path = tmp_path / "bomb.json.gz"
    path.write_bytes(gzip.compress(b'{"traceEvents":[' + b",".join([event] * events) + b"]}", 6))
    return path


def test_cut_points_inside_strings_cost_linear_time(tmp_path: Path) -> None:
    """One 60 MB event full of '},{': 20 s of CPU before (retries grew with the buffer),
    under a second now; the child's RLIMIT_CPU of 10 s is a generous ceiling."""
    path = _bomb(tmp_path, 1, 60 << 20)
    answer = run_dlci(["analyze", str(path), "--quiet"], cwd=tmp_path, cpu=10, what="")
    assert_clean(answer, frozenset({0}))


def test_the_cpu_ceiling_kills_a_bomb(tmp_path: Path) -> None:
    """Control: the same harness stops a child that spins (SIGXCPU), so the test above
    would fail on a reader that is quadratic again."""
    answer = run_dlci([], cwd=tmp_path, cpu=1, code="while True: pass")
    assert answer.code < 0 or answer.code > 128


def test_many_big_events_full_of_cut_points_are_read(tmp_path: Path, monkeypatch) -> None:
    """Valid JSON that the old reader refused ("no event boundary found"): 30 events of
    1 MB strings full of '},{'. Control: without the walk, the same file is refused."""
    path = _bomb(tmp_path, 30, 1 << 20)
    monkeypatch.setattr(reader, "MAX_EVENT", 8 << 20)  # the file is larger: no shortcut at EOF
    assert reader.read_trace(path).events == 30
    monkeypatch.setattr(reader._Slices, "walk", lambda self, buf, offset: (0, 0, -1))
    with pytest.raises(DlciError, match="not valid JSON"):
        reader.read_trace(path)


def test_deep_nesting_is_a_located_error(tmp_path: Path, capsys) -> None:
    deep = {**KERNEL, "args": {"x": "@"}}
    raw = json.dumps({"traceEvents": [deep]}).encode().replace(b'"@"', b"[" * 5000 + b"]" * 5000)
    assert main(["analyze", trace(tmp_path, raw=raw)]) == 1
    assert "of the decompressed trace nests JSON deeper" in capsys.readouterr().err
    assert main(["analyze", trace(tmp_path, {**KERNEL, "args": {"x": [[[1]]]}})]) == 0  # control


@pytest.mark.parametrize("field", ["device", "stream", "correlation", "bytes"])
def test_integers_beyond_64_bits_in_args_are_ignored(tmp_path: Path, field: str) -> None:
    raw = json.dumps({"traceEvents": [STEP, {**KERNEL, "args": {field: 2**70}}]}).encode()
    cols = reader.read_trace(trace(tmp_path, raw=raw))
    assert cols.events == 2 and len(cols.dev_ts) == 1  # the kernel kept, the field dropped
    assert int(cols.dev_device[0]) == 0 and int(cols.dev_corr[0]) == -1


@pytest.mark.parametrize(
    ("ts", "dur"), [(1e308, 1e308), (1e308, 1), (10**400, 1), (1, 10**30), (1, "inf"), (1, "nan")]
)
def test_impossible_times_are_an_error_naming_the_event(tmp_path: Path, capsys, ts, dur) -> None:
    was = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(0)  # to write 10**400; put back below (a global of the process)
    try:
        raw = json.dumps({"traceEvents": [STEP, {**KERNEL, "name": "evil", "ts": ts, "dur": dur}]})
    finally:
        sys.set_int_max_str_digits(was)
    assert main(["analyze", trace(tmp_path, raw=raw.encode())]) == 1
    err = capsys.readouterr().err
    assert "a device event 'evil' has an impossible time" in err and "nan%" not in err


def test_control_a_sane_trace_reports_finite_shares(tmp_path: Path, capsys) -> None:
    assert main(["analyze", trace(tmp_path, KERNEL)]) == 0
    assert "nan" not in capsys.readouterr().err


# ------------------------------------------------------------------ 3. reports


def _report(tmp_path: Path, name: str, **fields) -> str:
    path = tmp_path / name
    path.write_text(json.dumps({"kind": "utilization", "schema_version": 1, **fields}))
    return str(path)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"steps": {"mean_step_us": "x"}}, "steps.mean_step_us: expected a number, got 'x'"),
        ({"steps": [1]}, "steps: expected an object, got a list"),
        ({"gpu_utilization_pct": True}, "gpu_utilization_pct: expected a number, got true"),
        ({"phases": {"pct": 3}}, "phases.pct: expected an object, got 3"),
        ({"syncs": {"per_step": -1}}, "syncs.per_step: expected a number from 0 to 1e+18"),
    ],
)
def test_mistyped_utilization_fields_name_file_and_key(tmp_path, capsys, fields, message) -> None:
    good = _report(tmp_path, "head.json", gpu_utilization_pct=50.0)
    assert main(["compare-profiles", good, good]) == 0  # control
    capsys.readouterr()
    assert main(["compare-profiles", _report(tmp_path, "base.json", **fields), good]) == 1
    err = capsys.readouterr().err
    assert f"base.json: {message}" in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({}, "config: expected an object, got null"),
        ({"config": {"a": 1}, "best_loss": "x"}, "best_loss: expected a number, got 'x'"),
        ({"config": {"a": 2**70}}, "config.a: expected a 64-bit integer"),
        ({"config": {"a": "@"}}, "config.a.0.0.0.0"),
    ],
)
def test_mistyped_run_fields_name_file_and_key(tmp_path, capsys, fields, message) -> None:
    good = tmp_path / "a.json"
    good.write_text(json.dumps({"kind": "memorization", "schema_version": 1, "config": {"a": 1}}))
    assert main(["compare-runs", str(good), str(good)]) == 0  # control
    capsys.readouterr()
    bad = tmp_path / "b.json"
    text = json.dumps({"kind": "memorization", "schema_version": 1, **fields})
    bad.write_text(text.replace('"@"', "[" * 100 + "]" * 100))
    assert main(["compare-runs", str(good), str(bad)]) == 1
    assert f"b.json: {message}" in capsys.readouterr().err


# ------------------------------------------------------------------ 4. outputs


def _node(tmp_path: Path) -> tuple[Path, int]:
    """A character device (root: /dev/zero's) or a FIFO, in tmp_path."""
    node = tmp_path / "zero"
    if os.geteuid() == 0:
        os.mknod(node, stat.S_IFCHR | 0o666, os.makedev(1, 5))
        return node, stat.S_IFCHR
    os.mkfifo(node)
    return node, stat.S_IFIFO


def test_json_onto_a_device_leaves_the_device(tmp_path: Path, capsys, monkeypatch) -> None:
    node, kind = _node(tmp_path)
    assert main(["analyze", trace(tmp_path, KERNEL), "--json", str(node)]) == 1
    assert "dl-ci writes only regular files" in capsys.readouterr().err
    assert stat.S_IFMT(os.lstat(node).st_mode) == kind
    # control: without the check, the atomic rename replaces the node with a regular file
    monkeypatch.setattr("dlci.fsutil.check_output", lambda target: None)
    atomic_write_bytes(node, b"{}")
    assert stat.S_ISREG(os.lstat(node).st_mode)


def test_json_onto_the_null_device_discards_the_report(tmp_path: Path, capsys) -> None:
    link = tmp_path / "null"
    link.symlink_to(os.devnull)
    for where in (os.devnull, str(link)):
        assert main(["analyze", trace(tmp_path, KERNEL), "--json", where, "--quiet"]) == 0
        assert capsys.readouterr().err == ""
    assert stat.S_ISCHR(os.stat(os.devnull).st_mode) and link.is_symlink()


def test_json_with_no_event_object_is_exit_1(tmp_path: Path, capsys) -> None:
    path = tmp_path / "numbers.json"
    path.write_text("[1, 2, 3]")
    assert main(["analyze", str(path), "--json", "-"]) == 1
    out, err = capsys.readouterr()
    assert out == "" and "numbers.json: not a Kineto/Chrome trace: the JSON array holds 3" in err


def test_a_target_that_floods_stdout_leaves_the_report_alone_on_it(tmp_path: Path, capfd) -> None:
    argv = ["memorize", "--target", "calibrate_targets:floods_stdout", "--json", "-"]
    assert main([*argv, "--out", str(tmp_path), "--tracker", "none"]) == 0
    out, err = capfd.readouterr()
    assert json.loads(out)["verdict"] == "pass"  # the report, and only the report
    assert "FLOOD" in err and "RAW-FLOOD" in err  # the target's output, on standard error
    assert main(["memorize", "--target", "os:system", "--json", "-"]) == 1  # needs arguments
    out, err = capfd.readouterr()
    assert out == "" and "error: --target os:system: system(command) cannot be called" in err


def test_json_into_a_closed_pipe_ends_quietly(tmp_path: Path) -> None:
    path = trace(tmp_path, KERNEL)
    env = {**os.environ, "DLCI_LOG_DIR": str(tmp_path)}
    shell = f"{sys.executable} -m dlci analyze {path} --json - | head -c 0; exit ${{PIPESTATUS[0]}}"
    done = subprocess.run(
        ["bash", "-c", shell], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    head = subprocess.run(
        ["bash", "-c", shell.replace("-c 0", "-c 1")], capture_output=True, env=env, timeout=120
    )
    assert head.stdout == b"{" and b"Traceback" not in head.stderr


def test_control_a_closed_pipe_without_the_guard_gives_a_traceback(tmp_path: Path) -> None:
    code = "import sys, time; time.sleep(0.5); print('x' * 100000); sys.stdout.flush()"
    shell = f'{sys.executable} -c "{code}" | head -c 0'
    done = subprocess.run(["bash", "-c", shell], capture_output=True, text=True, timeout=60)
    assert "BrokenPipeError" in done.stderr
