"""Benchmark: time per training step of the digits example with and without dlci.Instruments.

Not a test: the overhead is reported, never asserted.

    python benchmarks/instruments_overhead.py [--steps 300] [--every 50] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "digits"


def run(steps: int, every: int | None) -> float:
    """Seconds per step over ``steps`` real training steps (after 20 warm-up steps)."""
    import itertools

    import dlci
    from digits_example.target import make_target
    from dlci.memorization.engine import seed_everything

    seed_everything(0)
    target = make_target()
    model, optimizer = target.model, target.optimizer(target.model.parameters())
    batches = itertools.cycle(list(target.train_loader))

    def train(n: int) -> None:
        for _ in range(n):
            inputs, labels = next(batches)
            optimizer.zero_grad()
            target.loss_fn(model(inputs), labels).backward()
            optimizer.step()
            if active:
                active[0].step()

    active: list[dlci.Instruments] = []
    if every is None:
        train(20)
        start = time.perf_counter()
        train(steps)
        return (time.perf_counter() - start) / steps
    with (
        tempfile.TemporaryDirectory() as log_dir,
        dlci.Instruments(model, every=every, log_dir=log_dir) as instruments,
    ):
        active.append(instruments)
        train(20)
        start = time.perf_counter()
        train(steps)
        return (time.perf_counter() - start) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--every", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    sys.path.insert(0, str(EXAMPLE))
    off, on = [], []
    for _ in range(args.repeats):
        off.append(run(args.steps, None))
        on.append(run(args.steps, args.every))
    a, b = statistics.median(off), statistics.median(on)
    print(
        f"per step: without {a * 1e3:.3f} ms, with Instruments(every={args.every}) "
        f"{b * 1e3:.3f} ms, ratio {b / a:.3f}"
    )


if __name__ == "__main__":
    main()
