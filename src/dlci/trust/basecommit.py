"""Trusted files read from a pull request's base commit, once, one way: the ladder
(dlci.ladder.trust) and the configuration (dlci.config.trust) both open the commit here.

:func:`open_commit` checks the commit id, refuses a project folder laid out as a bare git
repository or reached through a symbolic link inside the checkout (either would let the pull
request choose which files judge it), finds the checkout's top and makes sure the commit is
in it; :class:`CommitFiles` then reads regular files of that commit by path, symbolic links
followed within the repository, under a size cap. Host-side, never imports torch; git runs
with no fsmonitor, so no program the repository's config names is started.
"""

from __future__ import annotations

import os
import posixpath
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn

from dlci.errors import DlciError

GIT_TIMEOUT_S = 30.0
SYMLINK_HOPS = 8


class Unverifiable(Exception):
    """A trusted file cannot be read whole from the base commit; the message says why."""


@dataclass
class CommitFiles:
    """Regular files of one commit, by path from the repository's top; symlinks followed."""

    commit: str
    top: Path
    texts: dict[str, str] = field(default_factory=dict)  # every file read, by path
    limit: int = 1 << 20  # the largest file read, in bytes (a ladder's, a configuration's)

    def git(self, *args: str) -> bytes:
        # core.fsmonitor off: no program named by the repository's config runs here
        command = ["git", "-c", "core.fsmonitor=false", "--literal-pathspecs", *args]
        try:
            done = subprocess.run(
                command, cwd=self.top, capture_output=True, timeout=GIT_TIMEOUT_S, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise Unverifiable(f"git could not be run ({exc})") from None
        if done.returncode != 0:
            why = done.stderr.decode(errors="replace").strip().splitlines() or ["no message"]
            raise Unverifiable(f"git {args[0]} failed: {why[-1]}")
        return done.stdout

    def read(self, path: str) -> tuple[str, str]:
        """(the path read after symlinks, its text); Unverifiable when the commit lacks it."""
        for _ in range(SYMLINK_HOPS):
            listing = self.git("ls-tree", "-z", "--full-tree", self.commit, "--", path)
            entry = listing.split(b"\0")[0].decode(errors="replace")
            info, _, listed = entry.partition("\t")
            if not entry or listed != path:
                raise Unverifiable(f"{path} is not in the base commit {self.commit[:12]}")
            mode, kind, blob = info.split(" ")
            if kind != "blob":
                raise Unverifiable(f"{path} is not a file in the base commit")
            size = self.git("cat-file", "-s", blob).strip()
            if not size.isdigit() or int(size) > self.limit:  # never read a huge blob whole
                raise Unverifiable(
                    f"{path} in the base commit is larger than {self.limit} bytes, the most "
                    "such a file may hold"
                )
            content = self.git("cat-file", "blob", blob)
            if mode != "120000":
                try:
                    self.texts[path] = content.decode("utf-8")
                    return path, self.texts[path]
                except UnicodeDecodeError:
                    raise Unverifiable(f"{path} is not UTF-8 text in the base commit") from None
            path = inside(posixpath.dirname(path), content.decode(errors="replace"))
        raise Unverifiable(f"{path}: more than {SYMLINK_HOPS} symbolic links")


def inside(folder: str, reference: str) -> str:
    """``reference`` from ``folder``, as a path from the repository's top, or Unverifiable.

    >>> inside("ci/ladders", "../base.yaml")
    'ci/base.yaml'
    """
    joined = posixpath.normpath(posixpath.join(folder, reference))
    if posixpath.isabs(reference) or joined == ".." or joined.startswith("../"):
        raise Unverifiable(f"{reference!r} (from {folder or '.'}/) leaves the repository")
    return joined


def open_commit(commit: str, cwd: Path | None, limit: int) -> tuple[CommitFiles, str]:
    """The files of ``commit`` in the checkout around ``cwd``, and ``cwd`` as a path from the
    checkout's top; Unverifiable when the commit is not there, a DlciError for a layout that
    would let the pull request choose the commit's files (see the module docstring)."""
    if not re.fullmatch(r"[0-9a-f]{40}|[0-9a-f]{64}", commit):
        raise Unverifiable(f"the base commit {commit[:80]!r} is not a commit id")
    here = Path(os.path.realpath(cwd or Path.cwd()))
    refuse_bare_layout(here)
    top = CommitFiles(commit, here).git("rev-parse", "--show-toplevel").decode().strip()
    refuse_links(Path(os.path.abspath(cwd or Path.cwd())), Path(os.path.realpath(top)))
    files = CommitFiles(commit, Path(top), limit=limit)
    try:
        files.git("cat-file", "-e", f"{commit}^{{commit}}")
    except Unverifiable:
        raise Unverifiable(
            f"the base commit {commit[:12]} is not in this checkout (a shallow clone?)"
        ) from None
    return files, inside("", Path(os.path.relpath(here, os.path.realpath(top))).as_posix())


def refuse_bare_layout(here: Path) -> None:
    """A DlciError when a folder from ``here`` up to its checkout's top is laid out as a bare
    git repository (HEAD, objects/, refs/): git would take it for the repository, the base
    commit would not be found in it, and its gates would give way to the pull request's own. A pull
    request can commit such files; a project does not need them."""
    for folder in (here, *here.parents):
        if (folder / ".git").exists():
            return
        if all(p.exists() for p in (folder / "HEAD", folder / "objects", folder / "refs")):
            raise DlciError(
                f"{folder}: laid out as a git repository (HEAD, objects/, refs/) inside the "
                "checkout; git would read it instead of the repository",
                hint="remove HEAD, objects/ and refs/ from the project's folders: dl-ci reads "
                "the base commit's configuration with git (docs/security.md)",
            )


def refuse_links(path: Path, top: Path) -> None:
    """A DlciError when the project's folder is, or lies under, a symbolic link inside the
    checkout (or one leading out of it): the base commit's configuration is read at the
    folder's path, and a pull request that replaced the folder by a link (to a new folder, to
    the top) would choose the configuration that judges it, or one without any (no gates).
    Links above the checkout (the runner's own paths) are fine."""
    leaving = None
    for folder in (path, *path.parents):
        if folder.is_symlink():
            parent = Path(os.path.realpath(folder.parent))
            if parent == top or top in parent.parents:
                _link_error(path, folder)
            leaving = leaving or folder
        if Path(os.path.realpath(folder)) == top:
            return
    if leaving is not None:
        _link_error(path, leaving)


def _link_error(path: Path, link: Path) -> NoReturn:
    raise DlciError(
        f"the project's folder {str(path)[:200]} passes through a symbolic link "
        f"({link.name} -> {os.readlink(link)[:200]})",
        hint="set working-directory to the real folder: on a pull request the base commit's "
        "configuration is read at that path (docs/security.md)",
    )
