"""What torch's C++ profiler prints straight to file descriptor 2, held back from the console.

Kineto writes ``USDT: ... profiler_start``, ``ERROR: External init callback ...`` and its
warnings with C++ streams to fd 2, below Python's ``sys.stderr``, so redirecting
``sys.stderr`` does not catch them. :class:`NativeStderr` points fd 2 at a log file only
while a profiler call runs (start, step, stop), so the training step's own messages and
dl-ci's progress lines still reach the console; the caller keeps the log, or replays it
when the run fails.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import IO


class NativeStderr:
    """A log file that fd 2 points at inside :meth:`held`; see the module docstring."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file: IO[bytes] | None = None

    def __enter__(self) -> NativeStderr:
        self._file = open(self.path, "w+b")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """Send what is written to fd 2 (by C++ or Python) to the log while the block runs."""
        if self._file is None:
            yield
            return
        sys.stderr.flush()
        saved = os.dup(2)
        try:
            os.dup2(self._file.fileno(), 2)
            yield
        finally:
            with contextlib.suppress(ValueError, OSError):
                sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)

    def text(self) -> str:
        """Everything held back so far."""
        if self._file is not None:
            self._file.flush()
        try:
            return self.path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return ""

    def replay(self) -> None:
        """Write what was held back to the console (when the run failed, it may say why)."""
        text = self.text()
        if text:
            sys.stderr.write(text if text.endswith("\n") else text + "\n")
            sys.stderr.flush()

    def discard(self) -> None:
        """Remove the log (its text was replayed to the console)."""
        self.path.unlink(missing_ok=True)

    def keep_if_any(self) -> Path | None:
        """The log's path when something was held back; an empty log is removed."""
        if self.text().strip():
            return self.path
        self.path.unlink(missing_ok=True)
        return None
