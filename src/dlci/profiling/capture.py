"""Record torch.profiler traces of real training steps.

Two ways in:

- :func:`profile_target` runs the steps of a ``dlci.Target`` (what ``dlci profile`` does):
  real batches from its ``train_loader``, each step annotated ``dlci/data``,
  ``dlci/forward``, ``dlci/backward`` and ``dlci/optimizer`` (or ``dlci/train_step`` around a
  user's own ``train_step``);
- :class:`Profiler` (``dlci.profile(...)``), a context for a user's own loop::

      with dlci.profile(out="dlci-artifacts") as prof:
          for inputs, targets in loader:
              with prof.phase("forward"):
                  loss = loss_fn(model(inputs), targets)
              with prof.phase("backward"):
                  loss.backward()
              with prof.phase("optimizer"):
                  opt.step()
                  opt.zero_grad()
              if prof.step():  # False once the active steps are recorded
                  break

Both use a schedule (wait, warmup, active), so every recorded step carries a
``ProfilerStep#N`` marker, and write ``trace.json.gz`` (gzipped by torch because of the
name; Perfetto and chrome://tracing open it).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from dlci.errors import DlciError
from dlci.profiling.analysis import REPORT_NAME
from dlci.profiling.native_stderr import NativeStderr
from dlci.profiling.reader import read_trace
from dlci.profiling.session import (
    LOG_NAME,
    MEMORY_TRACE_NAME,
    TRACE_NAME,
    Schedule,
    TraceSession,
    TraceWriter,
    stamp,
    torch_profile,
)

PHASES = ("data", "forward", "backward", "optimizer", "train_step")


class Profiler:
    """A schedule-driven torch.profiler for a user's own loop; see the module docstring."""

    def __init__(
        self,
        out: str | Path = "dlci-artifacts",
        *,
        steps: int = 5,
        wait: int = 1,
        warmup: int = 1,
        device: Any = None,
        analyze: bool = True,
    ) -> None:
        self.schedule = Schedule(wait=wait, warmup=warmup, active=steps)
        self.out = Path(out)
        self.trace_path = self.out / TRACE_NAME
        self.analyze = analyze
        self.device = device
        self.steps_taken = 0
        self.report: dict[str, Any] | None = None
        self.log: Path | None = None  # torch.profiler's own messages, when it printed any
        self._prof: Any = None
        self._writer = TraceWriter(self.trace_path)
        self._stderr = NativeStderr(self.out / LOG_NAME)

    def __enter__(self) -> Profiler:
        import torch

        device = self.device
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.out.mkdir(parents=True, exist_ok=True)
        self._prof = torch_profile(self.schedule, torch.device(device), self._writer)
        self._stderr.__enter__()
        with self._stderr.held():
            self._prof.__enter__()
        return self

    def step(self) -> bool:
        """Mark the end of a training step. False once every active step is recorded."""
        with self._stderr.held():
            stamp(self._prof, self.steps_taken + 1, self.schedule)
            self._prof.step()
        self.steps_taken += 1
        return self.steps_taken < self.schedule.total

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Annotate a part of the step: data, forward, backward or optimizer."""
        if name not in PHASES:
            raise DlciError(f"unknown profile phase {name!r}", hint=f"use one of {PHASES}")
        import torch.profiler

        with torch.profiler.record_function(f"dlci/{name}"):
            yield

    def __exit__(self, *exc: Any) -> None:
        with self._stderr.held():
            self._prof.__exit__(*exc)
        if exc[0] is not None:
            self._stderr.replay()
            self._stderr.discard()
        else:
            self.log = self._stderr.keep_if_any()
        self._stderr.__exit__()
        if exc[0] is not None:
            return
        if not self._writer.written:
            raise DlciError(
                f"no trace was recorded: the loop ran {self.steps_taken} steps, and the "
                f"schedule waits {self.schedule.wait} and warms up {self.schedule.warmup} "
                "before it records",
                hint="run more steps, or lower wait/warmup",
            )
        if self.analyze:
            # numpy (metrics): only for a profiler that analyzes its own trace; script mode's
            # child (analyze=False) and parent (ProfileResult) import this module too
            from dlci.profiling import metrics

            report = metrics.analyze(read_trace(self.trace_path), source=str(self.trace_path))
            # the documented prof.report is the JSON's dict, as utilization.json holds it
            self.report = msgspec.to_builtins(report)


def profile(out: str | Path = "dlci-artifacts", **kwargs: Any) -> Profiler:
    """``with dlci.profile(out=...) as prof:`` around a training loop; see :class:`Profiler`."""
    return Profiler(out, **kwargs)


@dataclass
class ProfileResult:
    trace: Path
    steps: int
    device: str
    cpu_only: bool
    wall_time_s: float
    log: Path | None = None  # torch.profiler's own messages, when it printed any


def _remove_stale(out: Path) -> None:
    """An earlier run's trace and report go first: a run that ends inside the target's code
    (os._exit) must leave no trace or report that could pass for its own."""
    for name in (TRACE_NAME, MEMORY_TRACE_NAME, REPORT_NAME):
        path = out / name
        if path.is_file() or path.is_symlink():
            path.unlink()


def profile_target(
    target: Any,
    *,
    out: Path,
    schedule: Schedule,
    device: str | None = None,
    seed: int = 0,
    on_step: Callable[[int, int], None] | None = None,
) -> ProfileResult:
    """Train ``target`` for ``schedule.total`` steps under torch.profiler; write the trace.

    What torch.profiler prints on fd 2 goes to OUT/profiler.log (kept when not empty), or
    to the console instead when a step fails.
    """
    import torch

    out.mkdir(parents=True, exist_ok=True)
    _remove_stale(out)
    session = TraceSession(
        target, schedule=schedule, trace=out / TRACE_NAME, log=out / LOG_NAME,
        device=device, seed=seed,
    )  # fmt: skip
    start = time.perf_counter()  # the steps' time, not the model's move to the device
    trace = session.run(on_step=on_step)
    dev = session.device
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    return ProfileResult(
        trace=trace,
        steps=schedule.active,
        device=str(dev),
        cpu_only=dev.type != "cuda",
        wall_time_s=time.perf_counter() - start,
        log=session.log,
    )
