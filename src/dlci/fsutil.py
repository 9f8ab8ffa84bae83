"""File writing that never leaves a half-written file behind."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from dlci.errors import DlciError


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write to a temporary file beside ``path``, then rename it into place.

    A full disk or a crash leaves the old file (or none), never a truncated one.
    """
    target = Path(path)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    except OSError as exc:
        raise DlciError(
            f"{target}: cannot write ({exc.strerror or exc})",
            hint="check that the directory exists, is writable and has free space",
        ) from None
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp makes 0600; artifacts are for others too
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise DlciError(
            f"{target}: cannot write ({exc.strerror or exc})",
            hint="check that the directory is writable and has free space; "
            "files written before are untouched",
        ) from None
    return target


def _umask() -> int:
    mask = os.umask(0o22)
    os.umask(mask)
    return mask


def atomic_write_text(path: str | os.PathLike[str], text: str) -> Path:
    """``atomic_write_bytes`` for UTF-8 text."""
    return atomic_write_bytes(path, text.encode("utf-8"))
