"""Benchmark and agreement check: ``dlci analyze`` against Holistic Trace Analysis (HTA).

For each trace, runs in separate child processes

  (a) ``python -m dlci.cli analyze TRACE --json OUT`` with this interpreter, and
  (b) ``benchmarks/hta_reference.py TRACE`` with HTA's interpreter,

measures each child's wall time and peak RSS (``os.wait4``: the child's own
``ru_maxrss``, not the sum over all children), and prints a table: time and peak memory
of each, the dlci/HTA ratios, and the absolute differences in percentage points of the
temporal breakdown (dlci's ``devices[0].temporal_breakdown`` against HTA's rank 0),
flagging any above the tolerance (0.5 pp).

    python benchmarks/trace_vs_hta.py TRACE [TRACE ...] [--hta-python PATH] [--json OUT]

``--hta-python`` (or the environment variable HTA_PYTHON) is HTA's virtual environment
or its python executable; see benchmarks/README-traces.md for the setup. Without it,
the agreement is checked against the saved ``<trace>.hta.json`` next to the trace when
there is one (no HTA timing then). Not a test: nothing here runs in CI.

Exit status: 0 when every trace was compared and agrees; 1 when a difference is above
the tolerance or a child failed; 3 when ``dlci analyze`` is not available yet (HTA's
side is still run and reported).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
HTA_REFERENCE = HERE / "hta_reference.py"
FIELDS = ("idle_pct", "compute_pct", "non_compute_pct")
TOLERANCE_PP = 0.5
EXIT_DISAGREE = 1
EXIT_DLCI_UNAVAILABLE = 3


@dataclass
class Child:
    """One child process's outcome."""

    argv: list[str]
    returncode: int | None = None
    wall_s: float | None = None
    peak_rss_mib: float | None = None
    stdout: str = ""
    stderr: str = ""
    timed_out: bool = False


@dataclass
class TraceResult:
    trace: str
    size_mib: float
    dlci: dict[str, Any] = field(default_factory=dict)
    hta: dict[str, Any] = field(default_factory=dict)
    diff_pp: dict[str, float] = field(default_factory=dict)
    flagged: list[str] = field(default_factory=list)
    status: str = ""
    notes: list[str] = field(default_factory=list)


def run_child(argv: list[str], timeout_s: float) -> Child:
    """Run ``argv``; wall time and the child's own peak RSS from ``os.wait4``."""
    child = Child(argv=argv)
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=out, stderr=err, stdin=subprocess.DEVNULL)

        def kill() -> None:
            child.timed_out = True
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)

        timer = threading.Timer(timeout_s, kill)
        timer.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        finally:
            timer.cancel()
        child.wall_s = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)  # Popen must not reap it again
        child.returncode = proc.returncode
        # Linux reports ru_maxrss in KiB (macOS in bytes).
        scale = 1 / 1024 / 1024 if sys.platform == "darwin" else 1 / 1024
        child.peak_rss_mib = usage.ru_maxrss * scale
        out.seek(0)
        err.seek(0)
        child.stdout = out.read().decode("utf-8", "replace")
        child.stderr = err.read().decode("utf-8", "replace")
    return child


def hta_interpreter(given: str | None) -> Path | None:
    """HTA's python from a venv folder or an executable path; None when not set."""
    if not given:
        return None
    path = Path(given).expanduser()
    if path.is_dir():
        for candidate in (path / "bin" / "python", path / "Scripts" / "python.exe"):
            if candidate.exists():
                return candidate
        raise SystemExit(f"error: no bin/python under HTA environment {path}")
    if not path.exists():
        raise SystemExit(f"error: HTA python not found: {path}")
    return path


def saved_reference(trace: Path) -> Path:
    """``name.json(.gz)`` -> ``name.hta.json`` beside it."""
    name = trace.name
    for suffix in (".json.gz", ".json", ".gz"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
            break
    return trace.with_name(name + ".hta.json")


def _tail(text: str, lines: int = 3) -> str:
    return " | ".join(line for line in text.strip().splitlines()[-lines:])


def run_dlci(trace: Path, timeout_s: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="dlci-analyze-") as tmp:
        out = Path(tmp) / "utilization.json"
        argv = [sys.executable, "-m", "dlci.cli", "analyze", str(trace), "--json", str(out)]
        child = run_child(argv, timeout_s)
        result: dict[str, Any] = {
            "wall_s": child.wall_s,
            "peak_rss_mib": child.peak_rss_mib,
            "returncode": child.returncode,
        }
        if child.timed_out:
            result["error"] = f"timed out after {timeout_s:g} s"
            return result
        message = (child.stderr + child.stdout).strip()
        if child.returncode != 0:
            if "not available" in message:
                line = next(x for x in message.splitlines() if "not available" in x)
                result["unavailable"] = True
                result["error"] = line.strip()
            else:
                result["error"] = f"exit {child.returncode}: " + _tail(message)
            return result
        try:
            report = json.loads(out.read_text())
            breakdown = report["devices"][0]["temporal_breakdown"]
            result.update({key: float(breakdown[key]) for key in FIELDS})
        except (OSError, ValueError, KeyError, IndexError, TypeError) as exc:
            result["error"] = (
                f"no devices[0].temporal_breakdown in --json output ({type(exc).__name__}: {exc})"
            )
        return result


def run_hta(trace: Path, python: Path | None, timeout_s: float) -> dict[str, Any]:
    if python is None:
        saved = saved_reference(trace)
        if saved.is_file():
            data = json.loads(saved.read_text())
            data.update({"wall_s": None, "peak_rss_mib": None, "source": saved.name})
            return data
        return {"error": "no HTA python given (--hta-python / HTA_PYTHON) and no saved .hta.json"}
    child = run_child([str(python), str(HTA_REFERENCE), str(trace)], timeout_s)
    result: dict[str, Any] = {
        "wall_s": child.wall_s,
        "peak_rss_mib": child.peak_rss_mib,
        "returncode": child.returncode,
        "source": "hta_reference.py",
    }
    if child.timed_out:
        result["error"] = f"timed out after {timeout_s:g} s"
        return result
    try:
        data = json.loads(child.stdout)
    except ValueError:
        result["error"] = f"exit {child.returncode}: " + _tail(child.stderr)
        return result
    data.pop("hta_row", None)
    data.pop("idle_breakdown", None)
    result.update(data)
    return result


def compare(trace: Path, python: Path | None, timeout_s: float, tolerance: float) -> TraceResult:
    result = TraceResult(trace=str(trace), size_mib=trace.stat().st_size / 2**20)
    result.dlci = run_dlci(trace, timeout_s)
    result.hta = run_hta(trace, python, timeout_s)
    if "error" in result.hta:
        result.notes.append("HTA: " + result.hta["error"])
    if "error" in result.dlci:
        result.notes.append("dlci: " + result.dlci["error"])
    if "error" in result.dlci or "error" in result.hta:
        hta_ok = "error" not in result.hta
        result.status = "unavailable" if hta_ok and result.dlci.get("unavailable") else "failed"
        return result
    for key in FIELDS:
        result.diff_pp[key] = abs(result.dlci[key] - float(result.hta[key]))
    result.flagged = [key for key, diff in result.diff_pp.items() if diff > tolerance]
    result.status = "DISAGREE" if result.flagged else "ok"
    return result


def _num(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _ratio(a: float | None, b: float | None) -> str:
    if a is None or b is None or b == 0:
        return "-"
    return f"{a / b:.2f}x"


def print_table(results: list[TraceResult], tolerance: float) -> None:
    header = (
        f"{'trace':<34} {'MiB':>7} | {'dlci s':>7} {'dlci MiB':>8} | {'HTA s':>7} "
        f"{'HTA MiB':>8} | {'t ratio':>7} {'m ratio':>7} | {'d idle':>6} {'d comp':>6} "
        f"{'d ncmp':>6} | status"
    )
    print(header)
    print("-" * len(header))
    for r in results:
        name = Path(r.trace).name
        name = name if len(name) <= 34 else "..." + name[-31:]
        compared = r.status in ("ok", "DISAGREE")
        time_ratio = mem_ratio = "-"
        if compared:
            time_ratio = _ratio(r.dlci.get("wall_s"), r.hta.get("wall_s"))
            mem_ratio = _ratio(r.dlci.get("peak_rss_mib"), r.hta.get("peak_rss_mib"))
        diffs = [
            _num(r.diff_pp.get(key), ".2f") + ("!" if key in r.flagged else "") for key in FIELDS
        ]
        print(
            f"{name:<34} {r.size_mib:>7.2f} | {_num(r.dlci.get('wall_s'), '.2f'):>7} "
            f"{_num(r.dlci.get('peak_rss_mib'), '.0f'):>8} | {_num(r.hta.get('wall_s'), '.2f'):>7} "
            f"{_num(r.hta.get('peak_rss_mib'), '.0f'):>8} | "
            f"{time_ratio:>7} {mem_ratio:>7} | "
            f"{diffs[0]:>6} {diffs[1]:>6} {diffs[2]:>6} | {r.status}"
        )
        for side, data in (("dlci", r.dlci), ("HTA ", r.hta)):
            if all(key in data for key in FIELDS):
                pcts = "  ".join(f"{key}={float(data[key]):.2f}" for key in FIELDS)
                print(f"    {side}: {pcts}")
        for note in r.notes:
            print(f"    note: {note}")
    print(
        f"\nd = |dlci - HTA| in percentage points; '!' marks a difference above "
        f"{tolerance:g} pp. Ratios are dlci/HTA (wall time, peak RSS)."
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("traces", nargs="+", type=Path, help="Kineto traces (.json / .json.gz)")
    parser.add_argument(
        "--hta-python",
        default=os.environ.get("HTA_PYTHON"),
        help="HTA's virtual environment or python executable (default: $HTA_PYTHON)",
    )
    parser.add_argument("--json", type=Path, help="also write the results to this file")
    parser.add_argument(
        "--tolerance",
        type=float,
        default=TOLERANCE_PP,
        help=f"flag differences above this many percentage points (default {TOLERANCE_PP})",
    )
    parser.add_argument(
        "--timeout", type=float, default=1800, help="seconds allowed per child (default 1800)"
    )
    args = parser.parse_args(argv)
    skipped = [t for t in args.traces if t.name.endswith(".hta.json")]
    for path in skipped:
        print(f"skipping {path}: a saved HTA reference, not a trace", file=sys.stderr)
    args.traces = [t for t in args.traces if t not in skipped]
    if not args.traces:
        parser.error("no trace to compare")
    missing = [str(t) for t in args.traces if not t.is_file()]
    if missing:
        parser.error("no such trace file: " + ", ".join(missing))
    python = hta_interpreter(args.hta_python)

    results = []
    for trace in args.traces:
        print(f"... {trace}", file=sys.stderr, flush=True)
        results.append(compare(trace, python, args.timeout, args.tolerance))
    print_table(results, args.tolerance)

    if args.json:
        payload = {
            "tolerance_pp": args.tolerance,
            "hta_python": str(python) if python else None,
            "results": [asdict(r) for r in results],
        }
        args.json.write_text(json.dumps(payload, indent=2) + "\n")

    if any(r.status in ("DISAGREE", "failed") for r in results):
        return EXIT_DISAGREE
    if any(r.status == "unavailable" for r in results):
        print(
            "\ndlci analyze is not available in this build yet: only HTA's side was run.",
            file=sys.stderr,
        )
        return EXIT_DLCI_UNAVAILABLE
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
