"""A pull request's ladder read from its base commit, and the ceiling on a ladder not so read.

A pull request must not raise its own budget. ``ladder_at_commit`` reads the ladder a
workflow names, and every file of its ``extends`` chain, from the base commit's objects
(``git ls-tree`` / ``git cat-file blob``: raw bytes, no filters, nothing from the working
tree), resolving relative references against each file's path in that commit. A file the
base commit lacks (new in the pull request), a reference that leaves the repository, or a
base ladder that does not load makes the chain unverifiable (``Unverifiable``); the caller
then uses the pull request's own ladder under ``cap_tier``'s ceiling.
"""

from __future__ import annotations

import dataclasses
import os
import posixpath
import re
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dlci.errors import DlciError
from dlci.fsutil import read_input
from dlci.ladder.load import build_ladder, extend, load_ladder
from dlci.ladder.model import Ladder, Tier, TierRow
from dlci.ladder.versions import check_version
from dlci.ladder.yamlsource import LADDER_LIMIT, YamlSource, parse_yaml

GIT_TIMEOUT_S = 30.0
SYMLINK_HOPS = 8
CAPPED = ("max_epochs", "time_cap_minutes", "profile_steps", "nproc", "batch_size")
CEILING_BUDGET = "nightly"
Rows = Mapping[str, TierRow | None]


class Unverifiable(Exception):
    """The ladder cannot be read whole from the base commit; the message says why."""


@dataclass
class CommitFiles:
    """Regular files of one commit, by path from the repository's top; symlinks followed."""

    commit: str
    top: Path
    texts: dict[str, str] = field(default_factory=dict)  # every file read, by path

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
            if not size.isdigit() or int(size) > LADDER_LIMIT:  # never read a huge blob whole
                raise Unverifiable(f"{path} in the base commit is larger than a ladder may be")
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


def ladder_at_commit(path: str, commit: str, cwd: Path | None = None) -> tuple[Ladder, list[str]]:
    """The ladder ``path`` (as the workflow names it) read whole from ``commit``.

    Returns the ladder and the files of its chain that the working tree has changed (for a
    note). Raises Unverifiable when any file of the chain cannot be read from the commit.
    """
    if not re.fullmatch(r"[0-9a-f]{40}|[0-9a-f]{64}", commit):
        raise Unverifiable(f"the base commit {commit[:80]!r} is not a commit id")
    cwd = Path(os.path.realpath(cwd or Path.cwd()))
    top = CommitFiles(commit, cwd).git("rev-parse", "--show-toplevel").decode().strip()
    target = os.path.normpath(os.path.join(cwd, path))
    rel = inside("", Path(os.path.relpath(target, os.path.realpath(top))).as_posix())
    files = CommitFiles(commit, Path(top))
    try:
        files.git("cat-file", "-e", f"{commit}^{{commit}}")
    except Unverifiable:
        raise Unverifiable(
            f"the base commit {commit[:12]} is not in this checkout (a shallow clone?)"
        ) from None
    try:
        ladder = build_ladder(_chain(files, rel, ()), f"{commit[:12]}:{rel}")
    except DlciError as exc:
        raise Unverifiable(f"the base commit's ladder does not load: {exc}") from None
    return ladder, [p for p, text in files.texts.items() if not _same(Path(top) / p, text)]


def _same(path: Path, text: str) -> bool:
    """Whether the working tree's file holds ``text`` (a symlink to /dev/zero, a FIFO or a huge
    file is simply not the same: read_input reads regular files under the cap only)."""
    try:
        return read_input(path, what="ladder", limit=LADDER_LIMIT).decode("utf-8") == text
    except (DlciError, UnicodeDecodeError):
        return False


def _chain(files: CommitFiles, path: str, seen: tuple[str, ...]) -> YamlSource:
    real, text = files.read(path)
    display = f"{files.commit[:12]}:{path}"
    if real in seen:
        raise DlciError(f"{display}: 'extends' loops back to this file", file=display)
    source = check_version(parse_yaml(text, display))
    folder = posixpath.dirname(path)  # relative to the file as named, as load_ladder does
    return extend(source, lambda ref: _chain(files, inside(folder, ref), (*seen, real)))


# --------------------------------------------------------------------------- the ceiling


def ceiling_limits(tier: Tier, default: Ladder | None = None) -> dict[str, tuple[float, str]]:
    """The most an unverified ladder may give ``tier``: each value's limit and its origin.

    Resources (epochs, time, profiled steps, processes, batch) are capped at the default
    ladder's nightly row for the class; ``max_loss`` and ``max_relative_loss`` (where the
    default states them) at the default's row for the tier's own budget (a looser loss
    makes the gate easier). A class the default lacks gets the strictest
    value of any default row (of that budget, for the loss; of any budget when the default
    lacks the budget too): it cannot borrow a bigger class's limits.
    """
    default = default or load_ladder()
    cls = tier.hardware_class
    nightly = default.budgets[CEILING_BUDGET]
    same = default.budgets.get(tier.budget)
    loss_row = same.get(cls) if same else None
    budgets = [same] if same else list(default.budgets.values())
    found = {
        name: _limit(name, nightly.get(cls), CEILING_BUDGET, cls, [nightly]) for name in CAPPED
    }
    # the thresholds: only what the default states is capped (a looser loss makes the gate
    # easier; a relative threshold the unverified ladder leaves out is the default's)
    for name in ("max_loss", "max_relative_loss"):
        found[name] = _limit(name, loss_row, tier.budget, cls, budgets)
    return {name: limit for name, limit in found.items() if limit is not None}


def _limit(
    name: str,
    row: TierRow | None,
    budget: str,
    cls: str,
    budgets: list[Rows],
) -> tuple[float, str] | None:
    """The default's value of ``name`` for the row (None where the default states none)."""
    if row is not None:
        value = getattr(row, name)
        return None if value is None else (float(value), f"default {budget}, {cls}")
    rows = [r for table in budgets for r in table.values() if r is not None]
    values = [getattr(r, name) for r in rows if getattr(r, name) is not None]
    origin = f"the strictest default row: the default ladder has no {budget} row for {cls}"
    return (float(min(values)), origin) if values else None


def cap_tier(tier: Tier, limits: Mapping[str, tuple[float, str]], notes: list[str]) -> Tier:
    """``tier`` with every value above its limit lowered to it; each change noted."""
    changes: dict[str, Any] = {}
    for name, (limit, origin) in limits.items():
        value = getattr(tier, name)
        if value is None:  # a threshold the unverified ladder left out: the default's holds
            changes[name] = limit
            notes.append(f"{name} {limit:g} added from the ceiling ({origin})")
            continue
        if value > limit:
            lowered = int(limit) if isinstance(value, int) else limit
            changes[name] = lowered
            notes.append(f"{name} {value:g} lowered to the ceiling {lowered:g} ({origin})")
    return dataclasses.replace(tier, **changes) if changes else tier
