"""Each container's own copy of the checkout: the workspace the host hands back is never theirs.

Host-side (the runner), never imports torch. The pull request's code runs in every container
of the job, and git on the host runs in the workspace after them: actions/checkout's post step
(``git submodule foreach``), the next job's checkout on the same workspace (``submodule
status``, ``clean -ffdx``, ``reset --hard``). A nested repository that a container leaves in
the workspace (``<submodule>/.git`` with ``core.fsmonitor`` set to a command) would run that
command on the host, with the job's token. And a file one part leaves (a ``statistics.pyc``
at the top) would be imported by the next part.

So no container ever mounts the workspace: each part (the tests, each gate) gets a fresh copy
of it, made by the host from the checkout as the job began, in a folder beside the host's other
files (``RUNNER_TEMP``), which no host tool runs git in. The copy has no ``.git`` of its own:
the workspace's ``.git`` is mounted read-only over an empty folder there (with the credentials
hidden, dlci.action.host.gitview), and every file the view hides is copied empty. When the
part's container has gone, the host reads back what it may (the reports, under caps, no link
followed: dlci.action.host.gates), names every git file the container added or changed in its
copy (:func:`planted`: the job fails), and removes the copy.

A copy is made without following a link (a link is copied as a link, which resolves inside the
container) and without reading anything but directories and regular files (a FIFO or a device
in the checkout is left out and named).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import stat
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from dlci.errors import DlciError

GIT_DIR = ".git"
# The names git on the host reads at any depth of a working tree: a nested repository (a
# folder, or a file pointing at one: its config, hooks, info/, worktrees), the submodules'
# list. A container that adds or changes one in its copy is named and fails the job.
GIT_NAMES = frozenset({".git", ".gitmodules"})
WALK_LIMIT = 2_000_000  # entries in one copy: past that, the check fails closed
HASH_LIMIT = 1 << 20  # bytes of a git file read to compare it; larger ones: size and inode


@dataclass
class CopyNotes:
    """What a copy left out, and its size."""

    files: int = 0
    bytes: int = 0
    left_out: list[str] = field(default_factory=list)  # 'path: why'


def make_copy(
    workspace: Path, dest: Path, *, empty: Iterable[str] = (), mount_git: bool = True
) -> CopyNotes:
    """Copy ``workspace`` into the new folder ``dest``: folders, regular files (their mode
    and times) and symbolic links (as links). The top ``.git`` folder becomes an empty folder
    (the mount point of the workspace's own, read-only) when ``mount_git``; each path in
    ``empty`` (relative: what the git view hides) is an empty file."""
    notes = CopyNotes()
    blank = {os.path.normpath(rel) for rel in empty}
    dest.mkdir(mode=0o755)
    _copy_dir(workspace, dest, "", blank, notes, mount_git)
    if os.geteuid() == 0 and (os.getuid(), os.getgid()) != (0, 0):
        _own(dest, os.getuid(), os.getgid())  # the containers' user (their --user) owns it
    return notes


SPARSE_SLACK = 1 << 20  # bytes a file's apparent size may exceed what it holds on disk
MAX_DEPTH = 200  # folders deep in a tree a container wrote: past that, not used as a source


def measure(root: Path, *, limit_bytes: int, limit_files: int) -> str | None:
    """Why a tree a container wrote must not be the source of later copies, or None: more
    than ``limit_bytes`` (apparent sizes) or ``limit_files``, a sparse file (the copy would
    write its holes out in full), or deeper than MAX_DEPTH. Walked without recursion and
    without following a link."""
    total = files = 0
    stack = [(root, 0)]
    while stack:
        folder, depth = stack.pop()
        if depth > MAX_DEPTH:
            return f"folders nested deeper than {MAX_DEPTH}"
        try:
            with os.scandir(folder) as entries:
                listed = list(entries)
        except OSError as exc:
            return f"{folder.name}: {exc.strerror or exc}"
        for entry in listed:
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISDIR(info.st_mode):
                stack.append((Path(entry.path), depth + 1))
            elif stat.S_ISREG(info.st_mode):
                files += 1
                total += info.st_size
                if info.st_size - info.st_blocks * 512 > SPARSE_SLACK:
                    rel = os.path.relpath(entry.path, root)
                    return f"{rel} is sparse ({info.st_size >> 20} MiB of holes and data)"
            if total > limit_bytes or files > limit_files:
                return f"more than {limit_bytes >> 20} MiB or {limit_files} files"
    return None


def _own(dest: Path, uid: int, gid: int) -> None:
    os.lchown(dest, uid, gid)
    for folder, dirs, files in os.walk(dest):
        for name in [*dirs, *files]:
            os.lchown(os.path.join(folder, name), uid, gid)


def _copy_dir(
    source: Path, dest: Path, rel: str, blank: set[str], notes: CopyNotes, mount_git: bool
) -> None:
    with os.scandir(source / rel if rel else source) as entries:
        listed = sorted(entries, key=lambda e: e.name)
    for entry in listed:
        path = f"{rel}/{entry.name}" if rel else entry.name
        target = dest / path
        try:
            info = entry.stat(follow_symlinks=False)
        except OSError as exc:
            notes.left_out.append(f"{path}: {exc.strerror or exc}")
            continue
        if path in blank:
            target.touch(mode=0o644)
        elif stat.S_ISLNK(info.st_mode):
            os.symlink(os.readlink(entry.path), target)
        elif stat.S_ISDIR(info.st_mode):
            target.mkdir(mode=0o755)
            if not (path == GIT_DIR and mount_git):
                _copy_dir(source, dest, path, blank, notes, mount_git)
            os.chmod(target, stat.S_IMODE(info.st_mode) | 0o700)
        elif stat.S_ISREG(info.st_mode):
            _copy_file(entry.path, target, info)
            notes.files += 1
            notes.bytes += info.st_size
        else:
            notes.left_out.append(f"{path}: not a regular file, folder or link")


def _copy_file(source: str, target: Path, info: os.stat_result) -> None:
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK
    fd = os.open(source, flags)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # changed since it was listed
            raise DlciError(f"{source}: no longer a regular file while it was copied")
        out = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            _send(fd, out, info.st_size)
            os.fchmod(out, stat.S_IMODE(info.st_mode) | 0o600)
        finally:
            os.close(out)
        os.utime(target, ns=(info.st_atime_ns, info.st_mtime_ns), follow_symlinks=False)
    finally:
        os.close(fd)


def _send(fd: int, out: int, size: int) -> None:
    """Copy in the kernel (a reflink where the file system has them), else through a buffer."""
    left = size
    try:
        while left > 0:
            sent = os.copy_file_range(fd, out, min(left, 1 << 30))
            if sent == 0:
                break
            left -= sent
        return
    except OSError:
        os.lseek(fd, size - left, os.SEEK_SET)
    while chunk := os.read(fd, 1 << 20):
        os.write(out, chunk)


def remove_copy(dest: Path) -> bool:
    """Remove a copy whatever its container left there (folders it made unreadable or
    read-only); whether it is gone."""
    if not os.path.lexists(dest):
        return True
    for folder, dirs, _ in os.walk(dest):  # top-down: each folder opened before it is listed
        for name in dirs:
            path = os.path.join(folder, name)
            if not os.path.islink(path):
                with contextlib.suppress(OSError):
                    os.chmod(path, 0o700)
    shutil.rmtree(dest, ignore_errors=True)  # never follows a link (fd-based on Linux)
    return not os.path.lexists(dest)


# ---------------------------------------------------------------- what git on the host reads


def git_files(root: Path, *, skip_top_git: bool = True) -> dict[str, str]:
    """Every git file under ``root`` (``.git`` at any depth, folder, file or link, with all it
    holds; ``.gitmodules`` at any depth) -> what it is (kind, size, a hash of small files). The
    top ``.git`` is left out when ``skip_top_git`` (the read-only mount of the workspace's)."""
    found: dict[str, str] = {}
    seen = 0
    stack = [""]
    while stack:
        rel = stack.pop()
        try:
            with os.scandir(root / rel if rel else root) as entries:
                listed = list(entries)
        except OSError:
            continue
        seen += len(listed)
        if seen > WALK_LIMIT:
            raise DlciError(
                f"more than {WALK_LIMIT:,} files and folders to check for git files",
                hint="the pull request's code filled its copy of the workspace",
            )
        for entry in listed:
            path = f"{rel}/{entry.name}" if rel else entry.name
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if entry.name.lower() in GIT_NAMES and not (skip_top_git and path == GIT_DIR):
                found.update(_describe_all(root, path))
            elif stat.S_ISDIR(info.st_mode) and not (skip_top_git and path == GIT_DIR):
                stack.append(path)
    return found


def _describe_all(root: Path, rel: str) -> dict[str, str]:
    """A git file and, for a folder, everything in it."""
    described = {rel: _describe(root / rel)}
    if (root / rel).is_dir() and not (root / rel).is_symlink():
        for folder, dirs, files in os.walk(root / rel):
            for name in [*dirs, *files]:
                path = os.path.join(folder, name)
                described[os.path.relpath(path, root)] = _describe(Path(path))
    return described


def _describe(path: Path) -> str:
    try:
        info = os.lstat(path)
    except OSError:
        return "gone"
    if stat.S_ISLNK(info.st_mode):
        return f"link to {os.readlink(path)}"
    if stat.S_ISDIR(info.st_mode):
        return "folder"
    if not stat.S_ISREG(info.st_mode):
        return "special file"
    if info.st_size > HASH_LIMIT:
        return f"file of {info.st_size} bytes, inode {info.st_ino}"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as handle:
            digest = hashlib.sha256(handle.read(HASH_LIMIT + 1)).hexdigest()[:16]
    except OSError:
        return "unreadable file"
    return f"file {digest}"


def planted(before: dict[str, str], root: Path) -> list[str]:
    """The git files of ``root`` that are not as in ``before``: added, changed or removed,
    one line each ('sub/.git (added)'); inside a folder already named, nothing more."""
    after = git_files(root)
    named: set[str] = set()
    lines = []
    for rel in sorted(set(after) | set(before)):
        if before.get(rel) == after.get(rel) or any(a in named for a in _ancestors(rel)):
            continue
        named.add(rel)
        kind = "added" if rel not in before else "removed" if rel not in after else "changed"
        lines.append(f"{rel} ({kind})")
    return lines


def _ancestors(rel: str) -> Iterable[str]:
    rel = os.path.dirname(rel)
    while rel:
        yield rel
        rel = os.path.dirname(rel)


# ------------------------------------------------ files of the checkout the host reads


def refuse_links(path: Path, what: str) -> None:
    """Refuse ``path`` when it, or a folder on its way from the working folder (the checkout),
    is a symbolic link; an absolute path outside the working folder: its last name only."""
    base = Path.cwd()
    if path.is_absolute() and path.is_relative_to(base):
        path = path.relative_to(base)
    parts = path.parts
    start = len(parts) - 1 if path.is_absolute() else 0
    for index in range(start, len(parts)):
        here = Path(*parts[: index + 1])
        if here.name in ("", ".", ".."):
            continue
        if here.is_symlink():
            raise DlciError(
                f"{path}: {here} is a symbolic link; {what} is never read through a link",
                hint="commit the file itself, not a link to it",
            )
