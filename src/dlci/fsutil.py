"""Files in and out, safely: bounded reads of regular files only, atomic writes.

Every input dl-ci reads from a path (traces, reports) goes through :func:`open_input` or
:func:`read_input`: a device, a FIFO, a socket or a directory is refused before a byte is
read (``/dev/zero`` would never end, a FIFO would block), and so is a file over the size
cap. Every output goes through :func:`atomic_write_bytes`, which writes only over a regular
file (or where nothing is): no device is ever replaced, even as root; the null device is
where a report is discarded (``--json /dev/null``), so writing there succeeds and writes
nothing.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile
from collections.abc import Callable, Iterable
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
    return _checked(fd, target, what, limit, hint)


def _checked(fd: int, target: Path, what: str, limit: int, hint: str | None) -> BinaryIO:
    """The open descriptor as a file if it is a regular file of at most ``limit`` bytes."""
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
    return _read_all(open_input(path, what=what, limit=limit, hint=hint), path, what, limit)


def _read_all(handle: BinaryIO, path: object, what: str, limit: int) -> bytes:
    with handle:
        try:
            data = handle.read(limit + 1)
        except OSError as exc:
            raise DlciError(f"{path}: cannot read ({exc.strerror or exc})") from None
    if len(data) > limit:  # it grew while we read it
        raise DlciError(f"{path}: more than the {_size(limit)} dl-ci reads as a {what}")
    return data


# ------------------------------------------- beneath a folder a container could have changed
# A container that shares a folder with the host can replace any path in it by a symbolic link
# to a host file (or a FIFO, a device): below ``root`` (a folder the container cannot replace)
# these never follow a link, at any level, and never block.


def _parts(rel: str) -> list[str]:
    parts = [p for p in Path(rel).parts if p not in ("", ".")]
    if os.path.isabs(rel) or ".." in parts:
        raise DlciError(f"{rel}: not a path inside its folder")
    return parts


def _kind_at(name: str, folder: int, exc: OSError) -> str:
    try:
        mode = os.stat(name, dir_fd=folder, follow_symlinks=False).st_mode
    except OSError:
        return str(exc.strerror or exc)
    return "a symbolic link" if stat.S_ISLNK(mode) else _kind(mode)


def open_dir_beneath(root: str | os.PathLike[str], rel: str = ".", *, create: bool = False) -> int:
    """A descriptor of the directory ``root/rel``, no symbolic link below ``root`` followed;
    missing folders are made when ``create``. DlciError when one is a link or not a folder."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for part in _parts(rel):
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o755, dir_fd=fd)
                    if os.geteuid() == 0:  # see _own
                        os.chown(part, os.getuid(), os.getgid(), dir_fd=fd, follow_symlinks=False)
            try:
                inner = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            except OSError as exc:
                why = _kind_at(part, fd, exc)
                raise DlciError(f"{Path(root) / rel}: {part} is {why}, not a folder") from None
            os.close(fd)
            fd = inner
        return fd
    except BaseException:
        os.close(fd)
        raise


def open_beneath(
    root: str | os.PathLike[str], rel: str, *, what: str, limit: int = REPORT_LIMIT
) -> BinaryIO:
    """:func:`open_input` for ``root/rel``, no symbolic link below ``root`` followed."""
    parent, name = os.path.split(os.path.normpath(rel))
    target = Path(root) / rel
    folder = open_dir_beneath(root, parent or ".")
    try:
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK
        fd = os.open(name, flags, dir_fd=folder)
    except FileNotFoundError:
        raise DlciError(f"{target}: no such {what}") from None
    except OSError as exc:
        why = "is a symbolic link" if exc.errno == errno.ELOOP else f"cannot read ({exc.strerror})"
        raise DlciError(f"{target}: {why}; dl-ci reads only regular files") from None
    finally:
        os.close(folder)
    return _checked(fd, target, what, limit, None)


def read_beneath(
    root: str | os.PathLike[str], rel: str, *, what: str, limit: int = REPORT_LIMIT
) -> bytes:
    """The bytes of ``root/rel`` (see :func:`open_beneath`)."""
    handle = open_beneath(root, rel, what=what, limit=limit)
    return _read_all(handle, Path(root) / rel, what, limit)


def _own(fd: int) -> None:
    """What the host writes into a workspace belongs to the user the job's containers run as
    (os.getuid(), their --user): a host running as root hands it over, so the runner's user
    can remove the workspace; otherwise it is the writer's already."""
    if os.geteuid() == 0:
        os.fchown(fd, os.getuid(), os.getgid())


def write_beneath(root: str | os.PathLike[str], rel: str, data: bytes) -> None:
    """Write ``root/rel`` as a new regular file, no symbolic link below ``root`` followed:
    what is there (a file, a link, a FIFO) is removed first; a folder there is refused."""
    parent, name = os.path.split(os.path.normpath(rel))
    folder = open_dir_beneath(root, parent or ".", create=True)
    try:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=folder)
        fd = os.open(
            name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644, dir_fd=folder
        )
        _own(fd)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
    except OSError as exc:
        raise DlciError(f"{Path(root) / rel}: cannot write ({exc.strerror or exc})") from None
    finally:
        os.close(folder)


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


def is_null_device(target: str | os.PathLike[str]) -> bool:
    """Whether ``target`` is the null device (``/dev/null``, or a link to it, or a node of
    the same device): writing there discards, and never replaces it.

    >>> is_null_device(os.devnull), is_null_device(".")
    (True, False)
    """
    try:
        info, null = os.stat(target), os.stat(os.devnull)
    except OSError:
        return False
    return (
        stat.S_ISCHR(info.st_mode) and stat.S_ISCHR(null.st_mode) and info.st_rdev == null.st_rdev
    )


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write to a temporary file beside ``path``, then rename it into place.

    A full disk or a crash leaves the old file (or none), never a truncated one. Only a
    regular file is ever replaced (:func:`check_output`).
    """
    target = Path(path)
    if is_null_device(target):  # --json /dev/null: the report discarded, the device kept
        return target
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


NOT_ALLOWED = "not a file dl-ci writes there"  # copy_beneath's words for a name it skips


def mirror_beneath(
    source: Path, root: str | os.PathLike[str], rel: str, remove: Iterable[str] = ()
) -> None:
    """The files of the host folder ``source`` into ``root/rel``, no symbolic link below
    ``root`` followed (:func:`write_beneath`), after the names in ``remove`` are deleted."""
    folder = open_dir_beneath(root, rel, create=True)
    try:
        for name in remove:
            with contextlib.suppress(FileNotFoundError, IsADirectoryError):
                os.unlink(name, dir_fd=folder)
    finally:
        os.close(folder)
    for item in sorted(source.rglob("*")):
        if item.is_file():
            write_beneath(root, f"{rel}/{item.relative_to(source).as_posix()}", item.read_bytes())


def copy_beneath(
    root: str | os.PathLike[str],
    rel: str,
    into: Path,
    allowed: Callable[[str], bool],
    *,
    limit: int = REPORT_LIMIT,
    total: int = REPORT_LIMIT,
) -> list[str]:
    """Copy the regular files of ``root/rel`` whose relative path ``allowed`` accepts (a folder's
    path ends in ``/``) into the host folder ``into``, each under ``limit`` bytes, all under
    ``total``, no symbolic link followed; what was left out, one line each."""
    left: list[str] = []
    room = [total]

    def walk(sub: str) -> None:
        fd = open_dir_beneath(root, os.path.join(rel, sub))
        try:
            entries = sorted((e.name, e.is_dir(follow_symlinks=False)) for e in os.scandir(fd))
        finally:
            os.close(fd)
        for name, is_dir in entries:
            path = os.path.join(sub, name)
            if not allowed(path + "/" if is_dir else path):
                left.append(f"{path}: {NOT_ALLOWED}")
            elif is_dir:
                walk(path)
            else:
                try:
                    data = read_beneath(
                        root, os.path.join(rel, path), what="report", limit=min(limit, room[0])
                    )
                except DlciError as exc:
                    left.append(exc.message.replace(f"{Path(root) / rel}/", "", 1))
                    continue
                room[0] -= len(data)
                (into / path).parent.mkdir(parents=True, exist_ok=True)
                (into / path).write_bytes(data)

    into.mkdir(parents=True, exist_ok=True)
    walk("")
    return left


def refuse_link(folder: str | os.PathLike[str], what: str) -> None:
    """Refuse a report folder that is a symbolic link: in a checkout it may be the pull
    request's, pointing the host's writes at a folder of its choosing (the host venv, a hook)."""
    if os.path.islink(folder):
        raise DlciError(
            f"{folder}: the {what} folder is a symbolic link; refusing to write through it",
            hint="a committed dlci-artifacts link is the pull request's: remove it from the tree",
        )
