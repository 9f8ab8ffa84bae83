"""Peak memory and time of ``dlci analyze`` on a synthetic trace of 1 GB or more.

Writes a trace of at least ``--gb`` GB of uncompressed JSON (millions of events: a
tests/tracegen.py training loop repeated), then runs ``python -m dlci analyze`` on it in a
child process and reports the child's wall time and its own peak RSS (os.wait4). The aim
(issue: trace profiling) is a peak under 1 GiB for a trace of at least 1 GB.

    python benchmarks/large_trace.py --gb 1.0 [--gzip] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import tracegen


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gb", type=float, default=1.0, help="uncompressed size in GB (default 1.0)")
    p.add_argument("--gzip", action="store_true", help="write trace.json.gz instead")
    p.add_argument("--keep", metavar="DIR", help="write the trace here and keep it")
    args = p.parse_args()

    with tempfile.TemporaryDirectory(prefix="dlci-large-") as scratch:
        folder = Path(args.keep or scratch)
        folder.mkdir(parents=True, exist_ok=True)
        trace = folder / ("trace.json.gz" if args.gzip else "trace.json")
        start = time.perf_counter()
        size, events = tracegen.write_large(trace, int(args.gb * 1e9))
        written = time.perf_counter() - start
        print(
            f"wrote {trace.name}: {size / 1e9:.2f} GB uncompressed, {events:,} events, "
            f"{trace.stat().st_size / 1e6:.0f} MB on disk, in {written:.1f} s",
            flush=True,
        )
        out = folder / "utilization.json"
        start = time.perf_counter()
        child = subprocess.Popen(
            [sys.executable, "-m", "dlci", "analyze", str(trace), "--json", str(out), "--quiet"]
        )
        _, status, usage = os.wait4(child.pid, 0)
        wall = time.perf_counter() - start
        code = os.waitstatus_to_exitcode(status)
        peak_mib = usage.ru_maxrss / 1024
        report = json.loads(out.read_text()) if code == 0 else {}
        result = {
            "uncompressed_bytes": size,
            "events": events,
            "file_bytes": trace.stat().st_size,
            "analyze_wall_s": round(wall, 2),
            "analyze_peak_rss_mib": round(peak_mib, 1),
            "exit_code": code,
            "steps": report.get("steps", {}).get("count"),
            "gpu_utilization_pct": report.get("gpu_utilization_pct"),
        }
        print(json.dumps(result, indent=2))
        verdict = "under" if peak_mib < 1024 else "OVER"
        print(f"peak memory {peak_mib:.0f} MiB: {verdict} 1 GiB for a {size / 1e9:.2f} GB trace")
        return 0 if code == 0 and peak_mib < 1024 else 1


if __name__ == "__main__":
    raise SystemExit(main())
