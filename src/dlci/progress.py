"""Progress for long steps: a live bar on a terminal, a line every tenth of the way in CI logs."""

from __future__ import annotations

import sys
import time
from typing import Any


class StepProgress:
    """Reports (step, loss, best) of a loop of at most ``total`` steps; a context manager."""

    def __init__(self, total: int, label: str, *, enabled: bool = True, stream: Any = None) -> None:
        self.total, self.label, self.enabled = total, label, enabled
        self.stream = stream or sys.stderr
        self.every = max(1, total // 10)
        self._bar: Any = None
        self._task: Any = None
        self._start = time.perf_counter()

    def __enter__(self) -> StepProgress:
        if self.enabled and self.stream.isatty():
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

            self._bar = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                TextColumn("step {task.completed}/{task.total}"),
                TextColumn("{task.fields[status]}"),
                TimeElapsedColumn(),
                transient=True,
            )
            self._bar.__enter__()
            self._task = self._bar.add_task(self.label, total=self.total, status="")
        return self

    def __call__(self, step: int, loss: float, best: float) -> None:
        if not self.enabled:
            return
        status = f"loss {loss:.4g} best {best:.4g}"
        if self._bar is not None:
            self._bar.update(self._task, completed=step, status=status)
        elif step == 1 or step % self.every == 0:
            elapsed = time.perf_counter() - self._start
            print(
                f"{self.label}: step {step}/{self.total} {status} ({elapsed:.1f} s in, set-up "
                "included)",
                file=self.stream,
                flush=True,
            )

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.__exit__(*exc)
