"""How the corpus's trimmed traces were cut from their originals (see README.md).

    python tests/data/real/trim.py ORIGINAL OUT.json.gz [--steps N [--head US]]
                                   [--fraction F [--start S]]

Keeps every event that has no time (metadata), every event that starts before the end of the
first ``N`` ProfilerStep markers (or, with ``--fraction``, in the first fraction F of the
trace's time, from fraction S on with ``--start``: for traces without steps), and every
device event (kernel, memcpy, memset) launched by a runtime call that is kept, so that no
kept launch loses its kernel. With ``--head``, of each of those steps only the events that
start within its first US microseconds are kept (and the step markers themselves). Events keep their order and their fields; a top-level list
stays a list. ``traceName`` (a path on the recording machine) becomes its base name. Written
gzipped, with no time stamp in the gzip header, so the output is the same bytes every time.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
from pathlib import Path
from typing import Any

STEP = re.compile(r"ProfilerStep#\d+")
DEVICE = {"kernel", "gpu_memcpy", "gpu_memset", "Kernel", "Memcpy", "Memset"}


def _load(path: Path) -> Any:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return json.load(f)


def cutoff(
    events: list[dict[str, Any]], steps: int | None, fraction: float | None, start: float = 0.0
) -> tuple[float, float]:
    if steps is not None:
        marks = sorted(
            (e["ts"], e["ts"] + e.get("dur", 0))
            for e in events
            if STEP.fullmatch(str(e.get("name", ""))) and "ts" in e
        )
        return -1e300, float(marks[min(steps, len(marks)) - 1][1])
    times = [e["ts"] for e in events if isinstance(e.get("ts"), int | float)]
    lo, span = min(times), max(times) - min(times)
    return lo + span * start, lo + span * (fraction or 1.0)


def heads(events: list[dict[str, Any]], steps: int, head: float) -> list[tuple[float, float]]:
    """The first ``head`` microseconds of each of the first ``steps`` ProfilerSteps."""
    starts = sorted(e["ts"] for e in events if STEP.fullmatch(str(e.get("name", ""))) and "ts" in e)
    return [(t, t + head) for t in starts[:steps]]


def trim(
    data: Any,
    steps: int | None,
    fraction: float | None,
    start: float = 0.0,
    head: float | None = None,
) -> Any:
    events = data["traceEvents"] if isinstance(data, dict) else data
    begin, end = cutoff(events, steps, fraction, start)
    spans = heads(events, steps, head) if steps and head else [(begin, end)]

    def within(ts: float, e: dict[str, Any]) -> bool:
        marker = head is not None and STEP.fullmatch(str(e.get("name", ""))) is not None
        return begin <= ts <= end and (marker or any(lo <= ts <= hi for lo, hi in spans))

    kept_corr = {
        (e.get("args") or {}).get("correlation")
        for e in events
        if e.get("cat") not in DEVICE
        and isinstance(e.get("ts"), int | float)
        and within(e["ts"], e)
    }
    out = []
    for e in events:
        ts = e.get("ts")
        inside = not isinstance(ts, int | float) or e.get("ph") == "M" or within(ts, e)
        launched = e.get("cat") in DEVICE and (e.get("args") or {}).get("correlation") in kept_corr
        if inside or launched:
            out.append(e)
    if isinstance(data, dict):
        data = dict(data, traceEvents=out)
        if isinstance(data.get("traceName"), str):
            data["traceName"] = data["traceName"].replace("\\", "/").rsplit("/", 1)[-1]
        return data
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("original", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--steps", type=int)
    parser.add_argument("--fraction", type=float)
    parser.add_argument("--start", type=float, default=0.0)
    parser.add_argument("--head", type=float)
    args = parser.parse_args()
    data = _load(args.original)
    if args.steps or args.fraction:
        data = trim(data, args.steps, args.fraction, args.start, args.head)
    elif isinstance(data, dict) and isinstance(data.get("traceName"), str):
        data["traceName"] = data["traceName"].replace("\\", "/").rsplit("/", 1)[-1]
    text = json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode()
    with (
        open(args.out, "wb") as raw,
        gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=9, mtime=0) as f,
    ):
        f.write(text)


if __name__ == "__main__":
    main()
