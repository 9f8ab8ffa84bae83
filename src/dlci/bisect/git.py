"""The git a bisect needs: revisions resolved, the first-parent chain from good to bad, a
clean worktree per candidate (never the caller's working tree), a commit's author and pull
request number as its subject says them.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from dlci.errors import DlciError

GIT_TIMEOUT_S = 120.0
# "Merge pull request #12 from ..." (a merge commit) or "Subject (#12)" (a squash merge)
PULL_NUMBER = re.compile(r"^Merge pull request #(\d+)\b|\(#(\d+)\)\s*$")


@dataclass(frozen=True)
class Commit:
    sha: str
    subject: str
    author: str  # "Name <email>"
    date: str  # the author date, ISO 8601

    @property
    def short(self) -> str:
        return self.sha[:12]

    @property
    def pull_number(self) -> int | None:
        """The pull request its subject names (a merge or a squash), else None.

        >>> Commit("a" * 40, "Fix the loader (#42)", "A <a@x>", "").pull_number
        42
        >>> Commit("a" * 40, "Merge pull request #7 from o/b", "A <a@x>", "").pull_number
        7
        """
        found = PULL_NUMBER.search(self.subject)
        return int(found.group(1) or found.group(2)) if found else None

    def to_dict(self) -> dict[str, object]:
        return {
            "sha": self.sha,
            "subject": self.subject,
            "author": self.author,
            "date": self.date,
            "pull_number": self.pull_number,
        }


def git(repo: Path, *args: str, timeout: float = GIT_TIMEOUT_S) -> str:
    """``git -C repo ARGS``'s standard output; a failure is a DlciError with git's words."""
    if shutil.which("git") is None:
        raise DlciError("git is not on PATH", hint="dlci bisect needs git")
    try:
        done = subprocess.run(
            ["git", "-C", str(repo), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise DlciError(f"git {args[0]} took longer than {timeout:g} s") from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no message)"])[-1]
        raise DlciError(f"git {' '.join(args[:3])}: {last[:300]}")
    return done.stdout


def resolve(repo: Path, rev: str) -> str:
    """The full commit id of ``rev``; a revision that names no commit is a DlciError."""
    if not rev or rev.startswith("-"):
        raise DlciError(f"not a revision: {rev!r}", hint="give a commit, a tag or a branch")
    try:
        return git(repo, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}").strip()
    except DlciError:
        raise DlciError(
            f"{rev!r} names no commit in {repo}",
            hint="fetch the whole history first (actions/checkout with fetch-depth: 0)",
        ) from None


def chain(repo: Path, good: str, bad: str) -> list[Commit]:
    """The commits from ``good`` to ``bad`` along ``bad``'s first parents, both included:
    on a trunk each is one merged pull request (a squash or a merge commit)."""
    good_sha, bad_sha = resolve(repo, good), resolve(repo, bad)
    if good_sha == bad_sha:
        raise DlciError("--good and --bad are the same commit", hint="nothing to bisect")
    try:
        git(repo, "merge-base", "--is-ancestor", good_sha, bad_sha)
    except DlciError:
        raise DlciError(
            f"--good {good} is not an ancestor of --bad {bad}",
            hint="the good commit must come before the bad one on the same history",
        ) from None
    text = git(
        repo,
        "log",
        "--first-parent",
        "--reverse",
        "-z",
        "--format=%H%x00%s%x00%an <%ae>%x00%aI",
        f"{good_sha}..{bad_sha}",
    )
    fields = text.split("\0")
    commits = [
        Commit(fields[i].strip(), fields[i + 1], fields[i + 2], fields[i + 3])
        for i in range(0, len(fields) - 3, 4)
    ]
    if not commits or commits[-1].sha != bad_sha:
        raise DlciError(f"no first-parent path from {good} to {bad}")
    if good_sha not in git(repo, "rev-list", "--first-parent", bad_sha).split():
        raise DlciError(
            f"--good {good} is not on {bad}'s first-parent line (it came in by a merge)",
            hint="give the trunk's commit that merged it as --good",
        )
    head = git(repo, "log", "-1", "--format=%H%x00%s%x00%an <%ae>%x00%aI", good_sha)
    sha, subject, author, date = head.rstrip("\n").split("\0")
    return [Commit(sha, subject, author, date), *commits]


def shared_clone(repo: Path, path: Path) -> Path:
    """A clone of ``repo`` at ``path`` that borrows its objects (``--shared``, no checkout):
    the bisect's worktrees are this clone's, so nothing is written into the caller's
    repository, whose ``.git`` may be read-only (the action mounts it so in the container).
    Its configuration (credentials, hooks) stays behind: a clone copies none of it."""
    git(repo, "clone", "--quiet", "--shared", "--no-checkout", "--no-tags", ".", str(path))
    return path


def add_worktree(repo: Path, sha: str, path: Path) -> Path:
    """A detached, clean checkout of ``sha`` at ``path``: the caller's tree is untouched."""
    git(repo, "worktree", "add", "--detach", "--force", str(path), sha)
    return path
