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
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dlci.errors import DlciError
from dlci.fsutil import read_input
from dlci.ladder.load import build_ladder, extend, load_ladder
from dlci.ladder.model import Ladder, Tier, TierRow
from dlci.ladder.versions import check_version
from dlci.ladder.yamlsource import LADDER_LIMIT, YamlSource, parse_yaml
from dlci.trust.basecommit import CommitFiles, Unverifiable, inside, open_commit

CAPPED = ("max_epochs", "time_cap_minutes", "profile_steps", "nproc", "batch_size")
CEILING_BUDGET = "nightly"
Rows = Mapping[str, TierRow | None]


def ladder_at_commit(path: str, commit: str, cwd: Path | None = None) -> tuple[Ladder, list[str]]:
    """The ladder ``path`` (as the workflow names it) read whole from ``commit``.

    Returns the ladder and the files of its chain that the working tree has changed (for a
    note). Raises Unverifiable when any file of the chain cannot be read from the commit, and
    a DlciError for a layout that would let the pull request choose the commit's files (a
    bare-repository layout in the folder's path, or, for a ``cwd`` that names the folder, a
    symbolic link inside the checkout on the way: trust.basecommit.open_commit).
    """
    files, _ = open_commit(commit, cwd, LADDER_LIMIT)
    top = os.path.realpath(files.top)
    target = os.path.normpath(os.path.join(os.path.realpath(cwd or Path.cwd()), path))
    rel = inside("", Path(os.path.relpath(target, top)).as_posix())
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
