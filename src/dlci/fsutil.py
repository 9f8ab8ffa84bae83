"""Files in and out, safely: bounded reads of regular files only, atomic writes.

Every input dl-ci reads from a path (traces, reports) goes through :func:`open_input` or
:func:`read_input`: a device, a FIFO, a socket or a directory is refused before a byte is
read (``/dev/zero`` would never end, a FIFO would block), and so is a file over the size
cap. Every output goes through :func:`atomic_write_bytes`, which writes only over a regular
file (or where nothing is): ``--json /dev/null`` must not replace the device, even as root.
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path
from typing import BinaryIO

from dlci.errors import DlciError

REPORT_LIMIT = 64 << 20  # bytes: far beyond any report dl-ci writes


def _kind(mode: int) -> str:
    """What a file that is not a regular one is, in words.

    >>> _kind(stat.S_IFCHR), _kind(stat.S_IFIFO)
    ('a character device', 'a FIFO')
    """
    kinds = (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
    )
    return next((word for test, word in kinds if test(mode)), "not a plain file")


def _size(count: float) -> str:
    """A byte count for a message.

    >>> _size(64 << 20), _size(1500)
    ('64 MiB', '1500 bytes')
    """
    for shift, unit in ((30, "GiB"), (20, "MiB")):
        if count >= 1 << shift:
            return f"{count / (1 << shift):.3g} {unit}"
    return f"{count:.0f} bytes"


def open_input(
    path: str | os.PathLike[str], *, what: str, limit: int, hint: str | None = None
) -> BinaryIO:
    """Open ``path`` for reading if it is a regular file of at most ``limit`` bytes.

    ``what`` names the file in messages ("trace file"); ``hint`` says what to give instead.
    The file is opened without blocking (a FIFO would wait for a writer) and checked on the
    open descriptor, so what is checked is what is read.
    """
    target = Path(path)
    try:
        fd = os.open(target, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        raise DlciError(f"{target}: no such {what}", hint=hint) from None
    except IsADirectoryError:  # pragma: no cover - Linux opens directories read-only
        raise DlciError(f"{target}: is a directory, not a {what}", hint=hint) from None
    except OSError as exc:
        raise DlciError(f"{target}: cannot read ({exc.strerror or exc})", hint=hint) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            kind = _kind(info.st_mode)
            message = f"is {kind}, not a {what}" if kind == "a directory" else "not a regular file"
            raise DlciError(
                f"{target}: {message}" + ("" if kind == "a directory" else f" ({kind})"),
                hint=hint or f"give the path of a {what}; dl-ci reads only regular files",
            )
        if info.st_size > limit:
            raise DlciError(
                f"{target}: {_size(info.st_size)}, more than the {_size(limit)} dl-ci reads "
                f"as a {what}",
                hint=hint or "this is not a file dl-ci wrote; check the path",
            )
        if hasattr(os, "O_NONBLOCK"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_input(
    path: str | os.PathLike[str], *, what: str, limit: int = REPORT_LIMIT, hint: str | None = None
) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes (see :func:`open_input`)."""
    with open_input(path, what=what, limit=limit, hint=hint) as handle:
        try:
            data = handle.read(limit + 1)
        except OSError as exc:
            raise DlciError(f"{path}: cannot read ({exc.strerror or exc})") from None
    if len(data) > limit:  # it grew while we read it
        raise DlciError(f"{path}: more than the {_size(limit)} dl-ci reads as a {what}", hint=hint)
    return data


def check_output(target: Path) -> None:
    """Refuse to write over anything but a regular file: devices, FIFOs, directories.

    A symbolic link is followed: a link to ``/dev/null`` is refused like ``/dev/null``.
    """
    try:
        mode = os.stat(target).st_mode
    except OSError:
        return  # nothing there (or a dangling link): the rename creates the file
    if not stat.S_ISREG(mode):
        raise DlciError(
            f"{target}: is {_kind(mode)}; dl-ci writes only regular files",
            hint="give the path of a new or existing regular file, or '-' for standard "
            "output where the option takes it",
        )


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write to a temporary file beside ``path``, then rename it into place.

    A full disk or a crash leaves the old file (or none), never a truncated one. Only a
    regular file is ever replaced (:func:`check_output`).
    """
    target = Path(path)
    check_output(target)
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
        check_output(target)  # made in the meantime: still never replace a device
        os.replace(tmp, target)
    except (OSError, DlciError) as exc:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(exc, DlciError):
            raise
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
