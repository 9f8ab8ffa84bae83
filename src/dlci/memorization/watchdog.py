"""The time cap inside a step: a thread that ends a run whose step outlives the cap.

The training loop checks the time cap between steps; a step that never returns (a hang in
the user's code, an endless data loader, a stuck collective) would run until the job's own
timeout. The watchdog waits for the deadline in its own thread; when it passes with the run
still going, it takes the stuck thread's Python stack (``sys._current_frames``), hands it to
``on_expiry`` (which writes the partial report), flushes, and ends the process with exit 1:
the stuck thread cannot be interrupted, so ``os._exit`` is the only way out.

A C extension that holds the GIL forever also stops this thread; torch's kernels, sleeps,
I/O and collectives release it.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import traceback
from collections.abc import Callable

from dlci.training.guard import where

Expiry = Callable[[str, list[str]], None]  # (stuck at "file:line in function", the stack)


class Watchdog:
    """``arm(seconds)`` sets the deadline (again), ``stop()`` ends the watch."""

    def __init__(self, on_expiry: Expiry, *, exit: Callable[[int], None] = os._exit) -> None:
        self._on_expiry = on_expiry
        self._exit = exit  # tests pass a recorder
        self._watched = threading.get_ident()  # the thread that trains
        self._cond = threading.Condition()
        self._deadline = float("inf")
        self._done = False
        self.fired = False
        self._finished = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dlci-watchdog", daemon=True)

    def arm(self, seconds: float) -> None:
        with self._cond:
            self._deadline = time.monotonic() + seconds
            self._cond.notify()
        if not self._thread.is_alive() and not self._done:
            self._thread.start()

    def stop(self) -> None:
        """The run ended by itself; when the watchdog has just fired, wait for its exit."""
        with self._cond:
            self._done = True
            fired = self.fired
            self._cond.notify()
        if fired:
            self._finished.wait()
        elif self._thread.is_alive():
            # joined, and the callback dropped: a thread left holding the run (a DDP model and
            # its process group) until interpreter exit made gloo abort there ("terminate
            # called without an active exception", one run in three)
            self._thread.join(5)
        self._on_expiry = _nothing

    def _run(self) -> None:
        with self._cond:
            while not self._done:
                remaining = self._deadline - time.monotonic()
                if remaining <= 0:
                    self.fired = True
                    break
                self._cond.wait(remaining)
            if not self.fired:
                return
        try:
            stuck_at, stack = stack_of(self._watched)
            self._on_expiry(stuck_at, stack)
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            self._finished.set()
            self._exit(1)


def _nothing(stuck_at: str, stack: list[str]) -> None:
    """The callback of a watchdog that has stopped."""


def stack_of(thread_id: int) -> tuple[str, list[str]]:
    """Where a thread is (``file:line in function``, innermost frame) and its stack."""
    frame = sys._current_frames().get(thread_id)
    if frame is None:
        return "an unknown place (the thread ended)", []
    summaries = traceback.extract_stack(frame)
    stack = [
        f"{where(f)} in {f.name}" + (f": {f.line.strip()}" if f.line else "") for f in summaries
    ]
    innermost = summaries[-1]
    return f"{where(innermost)} in {innermost.name}", stack
