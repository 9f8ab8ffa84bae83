"""The build context as the host assembles it: one tar stream, hashed as it is sent.

Host-side (the runner), never imports torch. ``docker build`` used to receive the workspace
raw, so what it got and what the tag hashed could differ: the folders the hash leaves out on
purpose (``.git``, ``.venv``, ...) still reached the image, and with them the job token that
actions/checkout persists in ``.git/config`` (issue 35). Now the host writes the context
itself from the entries of ``dlci.action.ignore.rules`` (Docker's own ``.dockerignore`` rules, less
``ALWAYS_IGNORED``) and hands the stream to ``docker build -``: the tag is the SHA-256 of those
very bytes, and a build whose stream hashed otherwise (a file changed while it was sent) is
refused. The stream is reproducible: owner 0:0 without names, each entry's permission bits
(what the Docker CLI sends, so the legacy builder's layer cache, which hashes them, is shared
with builds from the raw folder), one fixed modification time (the cache leaves it out),
links as links, FIFOs and sockets left out.

The Dockerfile travels in the stream as ``.dlci-dockerfile`` with a ``.dockerignore`` naming
only it and itself: both builders take those two files out of what ``COPY`` sees, and read
no other rule (the project's ``.dockerignore`` was applied here already).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import re
import stat
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from dlci import jsonio
from dlci.action.ignore.rules import build_entries
from dlci.errors import DlciError
from dlci.fsutil import read_beneath

DOCKERFILE = ".dlci-dockerfile"
IGNORE = f"{DOCKERFILE}\n.dockerignore\n".encode()
# 2000-01-01: fixed, so the same files give the same bytes; zip (a wheel built in the image)
# refuses times before 1980
MTIME = 946684800
LIMIT = 4 << 20  # bytes of a Dockerfile, read without following a link
HASH_VERSION = b"dlci-inputs-3\0"


class Sink(Protocol):
    def write(self, data: bytes, /) -> object: ...


class _Tee:
    """Hashes what passes on to ``out`` (None: hash only)."""

    def __init__(self, out: Callable[[bytes], object] | None, build_args: dict[str, str]) -> None:
        self.digest = hashlib.sha256(HASH_VERSION + args_blob(build_args))
        self.out = out

    def write(self, data: bytes) -> int:
        self.digest.update(data)
        if self.out is not None:
            self.out(data)
        return len(data)


def _info(name: str, kind: bytes, mode: int, size: int = 0, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.size, info.linkname = kind, mode & 0o7777, size, link
    info.mtime, info.uid, info.gid, info.uname, info.gname = MTIME, 0, 0, "", ""
    return info


def write_context(dockerfile: Path, context: Path, sink: Sink) -> None:
    """Write the context's tar stream to ``sink``: exactly what the build receives."""
    with tarfile.open(fileobj=sink, mode="w|", format=tarfile.PAX_FORMAT) as tar:  # type: ignore[call-overload]
        data = read_beneath(dockerfile.parent, dockerfile.name, what="Dockerfile", limit=LIMIT)
        tar.addfile(_info(DOCKERFILE, tarfile.REGTYPE, 0o644, len(data)), io.BytesIO(data))
        tar.addfile(_info(".dockerignore", tarfile.REGTYPE, 0o644, len(IGNORE)), io.BytesIO(IGNORE))
        for entry in build_entries(dockerfile, context):
            if entry.rel in (DOCKERFILE, ".dockerignore"):
                continue  # the stream's own; the project's rules were applied here
            if entry.kind == "dir":
                with contextlib.suppress(OSError):  # gone: docker build would fail on it
                    perms = os.lstat(entry.path).st_mode
                    tar.addfile(_info(entry.rel, tarfile.DIRTYPE, perms))
            elif entry.kind == "link":
                target = os.readlink(entry.path)
                tar.addfile(_info(entry.rel, tarfile.SYMTYPE, 0o777, link=target))
            elif entry.kind == "file":
                _add_file(tar, entry.rel, entry.path)
            # FIFOs, sockets, devices: never read, never sent


def _add_file(tar: tarfile.TarFile, rel: str, path: Path) -> None:
    """One regular file, opened without following a link and without blocking."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
    except OSError as exc:
        raise DlciError(
            f"{rel}: cannot read this file of the build context: {exc.strerror}",
            hint="make it readable, or name it in .dockerignore",
        ) from None
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise DlciError(
                f"{rel}: was a regular file of the build context and is not one any more",
                hint="something changed the context while the image was being built",
            )
        try:
            tar.addfile(_info(rel, tarfile.REGTYPE, info.st_mode, info.st_size), handle)
        except OSError as exc:  # shorter than fstat said: changed while it was read
            raise DlciError(f"{rel}: changed while the build context was read ({exc})") from None


def context_hash(dockerfile: Path, context: Path, build_args: dict[str, str]) -> str:
    """The tag's hash: the build arguments and the very bytes the build would receive."""
    tee = _Tee(None, build_args)
    write_context(dockerfile, context, tee)
    return tee.digest.hexdigest()[:16]


def send_context(
    dockerfile: Path, context: Path, build_args: dict[str, str], out: Callable[[bytes], object]
) -> str:
    """Write the stream to ``out``; the hash of what was written (compare it with the tag)."""
    tee = _Tee(out, build_args)
    write_context(dockerfile, context, tee)
    return tee.digest.hexdigest()[:16]


_NON_ASCII = re.compile("[^\x00-\x7e]")  # what json.dumps escaped (ensure_ascii)


def args_blob(build_args: dict[str, str]) -> bytes:
    """The build arguments as ``json.dumps(sort_keys=True)`` spelled them, so tags stay stable.

    >>> args_blob({"B": "2", "A": "é"})
    b'{"A": "\\\\u00e9", "B": "2"}'
    """

    def text(value: str) -> str:
        return _NON_ASCII.sub(_ascii_escape, jsonio.encode(value, indent=False).decode())

    pairs = (f"{text(name)}: {text(value)}" for name, value in sorted(build_args.items()))
    return ("{" + ", ".join(pairs) + "}").encode()


def _ascii_escape(match: re.Match[str]) -> str:
    code = ord(match.group(0))
    if code < 0x10000:
        return f"\\u{code:04x}"
    code -= 0x10000  # a surrogate pair, as json.dumps writes one
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"
