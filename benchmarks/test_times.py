"""The test suite's time per test file, from pytest's JUnit XML, and a budget that holds.

    python benchmarks/test_times.py [--kept FILE] [--save] [--budget-s S] [--elapsed-s S] JUNIT

Prints the time per test file (the sum of its tests' setup, call and teardown, as the JUnit
file records them; under pytest-xdist the sum over the workers, so the total is more than
the wall time), largest first, next to the kept table (benchmarks/test-times.json) and the
change. With --elapsed-s (the wall time of the whole run) over --budget-s it warns, naming
the files that grew since the kept table; it never fails the run. --save writes the table
as the new kept one (do it when a round's growth is accepted, and commit the file).
"""

from __future__ import annotations

import argparse
import json
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KEPT = ROOT / "benchmarks" / "test-times.json"
#: a file "grew" when it takes this many seconds more than in the kept table, and this share
GROWTH_S = 10.0
GROWTH_SHARE = 0.25


@dataclass
class FileTime:
    tests: int = 0
    seconds: float = 0.0


def file_of(classname: str, root: Path = ROOT) -> str:
    """The test file a JUnit classname names: ``tests.e2e.test_act.TestX`` -> tests/e2e/test_act.py.

    The longest dotted prefix that is a file under ``root``; failing that (a JUnit file from
    another tree), everything up to the first ``test_`` part, or the whole name.
    """
    parts = classname.split(".")
    for end in range(len(parts), 0, -1):
        candidate = "/".join(parts[:end]) + ".py"
        if (root / candidate).is_file():
            return candidate
    for end, part in enumerate(parts, start=1):
        if part.startswith("test_"):
            return "/".join(parts[:end]) + ".py"
    return "/".join(parts) + ".py"


def per_file(junit: Path, root: Path = ROOT) -> dict[str, FileTime]:
    files: dict[str, FileTime] = {}
    for case in ET.parse(junit).getroot().iter("testcase"):  # noqa: S314 (pytest's own file)
        name = file_of(case.get("classname") or case.get("file") or "?", root)
        entry = files.setdefault(name, FileTime())
        entry.tests += 1
        entry.seconds += float(case.get("time") or 0.0)
    return files


def load_kept(path: Path) -> dict[str, FileTime]:
    if not path.is_file():
        return {}
    data = json.loads(path.read_text(encoding="utf-8"))
    return {name: FileTime(**entry) for name, entry in data.get("files", {}).items()}


def grown(now: dict[str, FileTime], kept: dict[str, FileTime]) -> list[tuple[str, float, float]]:
    """(file, kept seconds, now seconds) for each file that grew, most growth first."""
    out = []
    for name, entry in now.items():
        before = kept[name].seconds if name in kept else 0.0
        if entry.seconds - before > GROWTH_S and entry.seconds > before * (1 + GROWTH_SHARE):
            out.append((name, before, entry.seconds))
    return sorted(out, key=lambda row: row[1] - row[2])


def table(now: dict[str, FileTime], kept: dict[str, FileTime], top: int) -> str:
    rows = sorted(now.items(), key=lambda item: -item[1].seconds)
    width = max([len(name) for name, _ in rows[:top]] + [4])
    lines = [f"{'file':<{width}}  {'tests':>5}  {'seconds':>8}  {'kept':>8}  {'change':>7}"]
    for name, entry in rows[:top]:
        before = f"{kept[name].seconds:8.1f}" if name in kept else f"{'-':>8}"
        change = f"{entry.seconds - kept[name].seconds:+7.1f}" if name in kept else f"{'new':>7}"
        lines.append(f"{name:<{width}}  {entry.tests:5d}  {entry.seconds:8.1f}  {before}  {change}")
    if len(rows) > top:
        rest = rows[top:]
        seconds = sum(entry.seconds for _, entry in rest)
        tests = sum(entry.tests for _, entry in rest)
        lines.append(f"{f'({len(rest)} more files)':<{width}}  {tests:5d}  {seconds:8.1f}")
    tests = sum(entry.tests for entry in now.values())
    seconds = sum(entry.seconds for entry in now.values())
    kept_s = sum(entry.seconds for entry in kept.values())
    total = f"{'total':<{width}}  {tests:5d}  {seconds:8.1f}"
    lines.append(total + (f"  {kept_s:8.1f}  {seconds - kept_s:+7.1f}" if kept else ""))
    return "\n".join(lines)


def save(now: dict[str, FileTime], path: Path, elapsed_s: float | None) -> None:
    data = {
        "what": "seconds per test file (sum of its tests' times in junit.xml); see test_times.py",
        "wall_s": elapsed_s,
        "tests": sum(entry.tests for entry in now.values()),
        "seconds": round(sum(entry.seconds for entry in now.values()), 1),
        "files": {
            name: {"tests": entry.tests, "seconds": round(entry.seconds, 1)}
            for name, entry in sorted(now.items())
        },
    }
    path.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("junit", type=Path)
    parser.add_argument("--kept", type=Path, default=KEPT, help="the kept table (JSON)")
    parser.add_argument("--save", action="store_true", help="write this run as the kept table")
    parser.add_argument("--top", type=int, default=30, help="files shown (default 30)")
    parser.add_argument("--budget-s", type=float, help="the run's budget, in seconds")
    parser.add_argument("--elapsed-s", type=float, help="the run's wall time, in seconds")
    parser.add_argument("--root", type=Path, default=ROOT, help="the tree the tests are in")
    args = parser.parse_args(argv)
    if not args.junit.is_file():
        print(f"test_times: no {args.junit}: no table", file=sys.stderr)
        return 0
    now = per_file(args.junit, args.root)
    kept = load_kept(args.kept)
    print(table(now, kept, args.top))
    if args.budget_s and args.elapsed_s and args.elapsed_s > args.budget_s:
        names = grown(now, kept)
        said = ", ".join(f"{n} ({b:.0f} s -> {s:.0f} s)" for n, b, s in names) or "none"
        print(
            f"warning: the run took {args.elapsed_s / 60:.1f} min, over its budget of "
            f"{args.budget_s / 60:.0f} min; the files that grew since {args.kept.name}: {said}"
        )
    if args.save:
        save(now, args.kept, args.elapsed_s)
        print(f"kept table written: {args.kept}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
