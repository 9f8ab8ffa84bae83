"""Reference numbers from Holistic Trace Analysis (HTA) for one Kineto trace.

Runs HTA's temporal breakdown on rank 0 of one PyTorch profiler trace (``.json`` or
``.json.gz``) and prints one JSON object on stdout:

    {"idle_pct", "compute_pct", "non_compute_pct",          # HTA's, rounded to 0.01
     "idle_us", "compute_us", "non_compute_us",
     "span_us",    # HTA's "kernel_time(us)": last GPU event end - first GPU event start
     "kernel_us",  # GPU busy time: union of GPU event intervals (= span_us - idle_us)
     ...}

It runs under HTA's own interpreter, not the project's (HTA pins nothing we want in the
project's environment):

    $HTA_PYTHON/bin/python benchmarks/hta_reference.py TRACE [--idle-breakdown]

See benchmarks/README-traces.md for how to set HTA up and for the exact definitions HTA
uses. Exit status: 0 on success, 1 when HTA fails on the trace (the JSON then has an
"error" field), 2 on a usage error.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

RANK = 0


def _layout(trace: Path, workdir: Path) -> Path:
    """Place the trace in ``workdir`` under a name HTA accepts (ends in .json or .gz)."""
    suffix = ".json.gz" if trace.name.endswith(".gz") else ".json"
    target = workdir / f"rank-{RANK}.pt.trace{suffix}"
    try:
        target.symlink_to(trace.resolve())
    except OSError:
        shutil.copyfile(trace, target)
    return target


def _plain(value: Any) -> Any:
    """numpy/pandas scalars to plain Python numbers for json."""
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _temporal(analysis: Any) -> dict[str, Any]:
    frame = analysis.get_temporal_breakdown(visualize=False)
    row = frame[frame["rank"] == RANK]
    if row.empty:
        raise RuntimeError(f"HTA returned no temporal breakdown for rank {RANK}")
    raw = {column: _plain(row.iloc[0][column]) for column in frame.columns}
    span = raw["kernel_time(us)"]
    idle = raw["idle_time(us)"]
    return {
        "idle_pct": raw["idle_time_pctg"],
        "compute_pct": raw["compute_time_pctg"],
        "non_compute_pct": raw["non_compute_time_pctg"],
        "idle_us": idle,
        "compute_us": raw["compute_time(us)"],
        "non_compute_us": raw["non_compute_time(us)"],
        "kernel_us": _plain(span - idle),
        "span_us": span,
        "hta_row": raw,
    }


def _gpu_event_count(analysis: Any) -> int:
    """Events HTA's temporal breakdown counts: those left with a stream after filtering."""
    frame = analysis.t.get_trace(RANK)
    return int(frame["stream"].ne(-1).sum())


def _idle_breakdown(analysis: Any) -> list[dict[str, Any]]:
    frame, _ = analysis.get_idle_time_breakdown(ranks=[RANK], visualize=False)
    return [
        {key: _plain(value) for key, value in record.items()} for record in frame.to_dict("records")
    ]


def analyze(trace: Path, *, idle_breakdown: bool = False) -> dict[str, Any]:
    from hta.trace_analysis import TraceAnalysis  # imported here: HTA's interpreter only

    result: dict[str, Any] = {"trace": trace.name, "rank": RANK}
    try:
        from importlib.metadata import version

        result["hta_version"] = version("HolisticTraceAnalysis")
    except Exception:  # the version is informative only
        result["hta_version"] = None
    workdir = Path(tempfile.mkdtemp(prefix="hta-ref-"))
    try:
        linked = _layout(trace, workdir)
        start = time.perf_counter()
        # HTA prints progress to stdout in places; keep stdout for our JSON alone.
        with contextlib.redirect_stdout(sys.stderr):
            # trace_files pins the file to rank 0 whatever its distributedInfo says;
            # with trace_dir alone HTA reads the rank from the file's first '"rank": N'.
            analysis = TraceAnalysis(trace_files={RANK: str(linked)}, trace_dir=str(workdir))
            loaded = time.perf_counter()
            result.update(_temporal(analysis))
            result["gpu_event_count"] = _gpu_event_count(analysis)
            if idle_breakdown:
                result["idle_breakdown"] = _idle_breakdown(analysis)
        done = time.perf_counter()
        result["load_s"] = round(loaded - start, 3)
        result["analysis_s"] = round(done - loaded, 3)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace", type=Path, help="Kineto trace, .json or .json.gz")
    parser.add_argument(
        "--idle-breakdown",
        action="store_true",
        help="also run get_idle_time_breakdown() (per stream: host/kernel/other wait)",
    )
    parser.add_argument("--verbose", action="store_true", help="keep HTA's own log lines on stderr")
    args = parser.parse_args(argv)
    if not args.trace.is_file():
        parser.error(f"no such trace file: {args.trace}")
    if not (args.trace.name.endswith(".json") or args.trace.name.endswith(".gz")):
        parser.error("HTA reads only .json and .json.gz traces")
    if not args.verbose:
        logging.getLogger("hta").setLevel(logging.ERROR)
        warnings.filterwarnings("ignore")
    try:
        result = analyze(args.trace, idle_breakdown=args.idle_breakdown)
    except ModuleNotFoundError as exc:
        print(json.dumps({"trace": args.trace.name, "error": f"HTA not importable: {exc}"}))
        return 1
    except Exception as exc:  # report HTA's failure as data
        error = f"{type(exc).__name__}: {exc}"
        print(json.dumps({"trace": args.trace.name, "error": error}))
        return 1
    print(json.dumps(result, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
