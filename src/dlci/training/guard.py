"""Calls into the user's code: what comes back is a result or one DlciError, never an exit.

Every call into a target's code (its module's import, its factory, ``train_loader``, the
model, ``loss_fn``, ``train_step``, ``eval_step``, the optimizer factory) runs inside
:func:`user_code`:

- ``SystemExit`` (``sys.exit(0)`` in the user's code) becomes :class:`TargetExited`: a gate
  needs a verdict, and a process that exits 0 without one must not read as a pass;
- any other exception becomes a ``DlciError`` located at the user's own file and line, its
  hint listing the user's frames first and dl-ci's after (exit 1, no traceback);
- an exception whose innermost frame is dl-ci's own is a bug in dl-ci: it passes unchanged,
  so the CLI reports it as one (exit 3, traceback in the log).
"""

from __future__ import annotations

import os
import sysconfig
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import TracebackType

from dlci.errors import DlciError

PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # src/dlci
_LIBRARY_DIRS = tuple(
    {
        os.path.abspath(path)
        for key in ("stdlib", "platstdlib", "purelib", "platlib")
        if (path := sysconfig.get_paths().get(key))
    }
)
EXIT_HINT = (
    "dl-ci needs the target's code to return: a gate passes only on a verdict, so an exit "
    "inside the target (sys.exit, os._exit, exit()) is a failure; remove the exit, or raise "
    "an exception instead"
)


class UserCodeError(DlciError):
    """An exception of the user's code, located at the user's own frame (exit 1)."""


class TargetExited(DlciError):
    """The target's code asked the process to exit before dl-ci reached a verdict."""


def is_dlci(filename: str) -> bool:
    return os.path.abspath(filename).startswith(PACKAGE_DIR + os.sep)


def is_library(filename: str) -> bool:
    path = os.path.abspath(filename)
    return (
        filename.startswith("<frozen")
        or path.startswith(_LIBRARY_DIRS)
        or f"{os.sep}site-packages{os.sep}" in path
    )


def shown_path(filename: str) -> str:
    """A path relative to the current directory when it lies below it."""
    path = os.path.abspath(filename)
    cwd = os.getcwd()
    return os.path.relpath(path, cwd) if path.startswith(cwd + os.sep) else filename


def frames(tb: TracebackType | None) -> list[traceback.FrameSummary]:
    return list(traceback.extract_tb(tb))


def user_frame(summaries: list[traceback.FrameSummary]) -> traceback.FrameSummary | None:
    """The innermost frame of the user's own code; else the innermost outside dl-ci."""
    outside = [f for f in summaries if not is_dlci(f.filename)]
    own = [f for f in outside if not is_library(f.filename)]
    chosen = own or outside
    return chosen[-1] if chosen else None


def where(frame: traceback.FrameSummary | None) -> str:
    """``file:line`` of a frame, or ``an unknown place``."""
    return f"{shown_path(frame.filename)}:{frame.lineno}" if frame else "an unknown place"


def raised_by_dlci(exc: BaseException) -> bool:
    """Whether dl-ci's own code raised ``exc`` (its innermost frame is in the package). A
    torch function mode of dl-ci's (``__torch_function__``: it passes every op on) is not the
    raiser: the op it called is."""
    summaries = [f for f in frames(exc.__traceback__) if not _passes_ops_on(f)]
    return bool(summaries) and is_dlci(summaries[-1].filename)


def _passes_ops_on(frame: traceback.FrameSummary) -> bool:
    return frame.name == "__torch_function__" and is_dlci(frame.filename)


def frames_text(summaries: list[traceback.FrameSummary], limit: int = 4) -> str:
    """The user's frames first (the last ``limit``), then dl-ci's, one ``file:line in f`` each."""

    def lines(chosen: list[traceback.FrameSummary]) -> list[str]:
        return [
            f"    {shown_path(f.filename)}:{f.lineno} in {f.name}"
            + (f": {f.line.strip()}" if f.line else "")
            for f in chosen
        ]

    user = [f for f in summaries if not is_dlci(f.filename)][-limit:]
    ours = [f for f in summaries if is_dlci(f.filename) and f.filename != __file__][-limit:]
    text = "\n".join(["your code (innermost last):", *lines(user)])
    if ours:
        text += "\n" + "\n".join(["  called from dl-ci:", *lines(ours)])
    return text


def exited(exc: SystemExit, what: str) -> TargetExited:
    """The failure for ``sys.exit(code)`` raised by the user's code while dl-ci ran ``what``."""
    call = "sys.exit()" if exc.code is None else f"sys.exit({exc.code!r})"
    frame = user_frame(frames(exc.__traceback__))
    return TargetExited(
        f"the target exited before a verdict: {call} in {where(frame)} ({what})", hint=EXIT_HINT
    )


def user_error(
    exc: BaseException, what: str, step: int | None = None, hint: str | None = None
) -> DlciError:
    """The DlciError for an exception of the user's code, located at the user's frame."""
    summaries = frames(exc.__traceback__)
    frame = user_frame(summaries)
    prefix = f"step {step}: " if step is not None else ""
    lead = f"{hint}\n" if hint else ""
    return UserCodeError(
        f"{prefix}{what} raised {type(exc).__name__}: {exc}",
        file=shown_path(frame.filename) if frame else None,
        line=frame.lineno if frame else None,
        hint=lead + "the error is in your code; " + frames_text(summaries),
    )


@contextmanager
def user_code(
    what: str,
    step: int | None = None,
    hint_for: Callable[[BaseException], str | None] | None = None,
) -> Iterator[None]:
    """Run the block as a call into the user's code (see the module docstring)."""
    try:
        yield
    except DlciError:
        raise
    except SystemExit as exc:
        raise exited(exc, what) from None
    except Exception as exc:
        if raised_by_dlci(exc):
            raise
        raise user_error(exc, what, step, hint_for(exc) if hint_for else None) from None
