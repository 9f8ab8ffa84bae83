"""Benchmark: time to verdict with early stop vs the tier's full epoch budget.

Runs the bundled digits example at the PR tier on the CPU, both ways, and prints the
figures and their ratio. Not a test: speed is reported, never asserted.

    python benchmarks/early_stop.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "digits"


def in_process(repeats: int) -> dict[str, list[float]]:
    """Training-loop time only (imports and data loading excluded)."""
    sys.path.insert(0, str(EXAMPLE))
    from digits_example.target import make_target
    from dlci.ladder.tiers import choose_tier
    from dlci.memorization.engine import MemorizeConfig, memorize, seed_everything

    tier = choose_tier(budget="pr", hardware="cpu")
    times: dict[str, list[float]] = {"early stop": [], "full budget": []}
    steps: dict[str, int] = {}
    for _ in range(repeats):
        for name, early in (("early stop", True), ("full budget", False)):
            seed_everything(0)
            target = make_target()
            config = MemorizeConfig.from_tier(tier, early_stop=early)
            start = time.perf_counter()
            result = memorize(target, config)
            times[name].append(time.perf_counter() - start)
            steps[name] = result.steps
            assert result.passed, result.reason
    print(f"steps to verdict: early stop {steps['early stop']}, full budget {steps['full budget']}")
    return times


def whole_command(repeats: int) -> dict[str, list[float]]:
    """``dlci memorize`` as a user runs it: process start to exit."""
    import tempfile

    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    out = tempfile.mkdtemp(prefix="dlci-bench-")
    times: dict[str, list[float]] = {"early stop": [], "full budget": []}
    for _ in range(repeats):
        for name, extra in (("early stop", []), ("full budget", ["--no-early-stop"])):
            start = time.perf_counter()
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "dlci",
                    "memorize",
                    "--budget",
                    "pr",
                    "--hardware",
                    "cpu",
                    "--quiet",
                    "--tracker",
                    "none",
                    "--out",
                    out,
                    *extra,
                ],
                cwd=EXAMPLE,
                env=env,
                check=True,
                capture_output=True,
            )
            times[name].append(time.perf_counter() - start)
    return times


def report(title: str, times: dict[str, list[float]]) -> None:
    early, full = statistics.median(times["early stop"]), statistics.median(times["full budget"])
    print(f"{title}: early stop {early:.3f} s, full budget {full:.3f} s, ratio {early / full:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    report("training loop (median)", in_process(args.repeats))
    report("whole command (median)", whole_command(max(1, args.repeats // 2)))


if __name__ == "__main__":
    main()
