"""What a pull request's run is configured with: trusted keys and the policy from its base.

A pull request must not waive its own failures or loosen its own gates. On a pull request
the host reads the configuration file of the base commit from the commit's objects (as a
ladder is read, ``dlci.ladder.trust.CommitFiles``: raw bytes, nothing from the working tree);
the trusted keys (the gates and bounds) and the doctor's policy come from it, the other keys
from the working tree. What the pull request changes in them is a note: it takes effect once
merged. A base commit the checkout lacks (a shallow clone) gives no waiver and the default
thresholds; the gates then come from the working tree (never looser than the defaults, which
have none), with a note.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dlci.config.keys import KEYS, TRUSTED
from dlci.config.resolve import DEFAULT, Config, combine, read_project, resolve
from dlci.config.source import CONFIG_LIMIT, DLCI_TOML, PYPROJECT, TomlSource, from_text
from dlci.config.validate import Values, read_table
from dlci.errors import DlciError
from dlci.policy import Policy
from dlci.trust.basecommit import Unverifiable, open_commit

MERGED = "it takes effect once merged"
NOW = "applied now (removing a waiver only makes the doctor stricter)"


def trusted_config(
    base_commit: str | None, *, cwd: Path | None = None, env: Mapping[str, str] | None = None
) -> Config:
    """The configuration a pull request with this base commit gets (None: not a pull request,
    the working tree's as it is)."""
    env = os.environ if env is None else env
    if base_commit is None:
        return resolve(cwd=cwd, env=env)
    values, policy, file = read_project(cwd)
    notes: list[str] = []
    try:
        base_values, base_policy = base_table(base_commit, cwd)
    except Unverifiable as exc:
        shallow = "shallow" in str(exc)
        notes.append(
            f"the base commit's configuration cannot be read ({exc}): the trusted keys "
            f"({', '.join(TRUSTED)}) come from the pull request's own file (where it could "
            "only switch a gate off, as the defaults do) and no waiver or threshold applies"
            + (
                "; check out with fetch-depth: 2 (or 0) so the base commit is there"
                if shallow
                else ""
            )
        )
        # never looser than the defaults (no gate, the default ladder under the ladder's
        # own ceiling rule), and stricter for every pull request that keeps its gates
        base_values = {k: v for k, v in values.items() if KEYS[k].trusted}
        base_policy = Policy(origin=f"defaults (base commit {base_commit[:12]} unreadable)")
    else:
        notes += changes(values, policy, base_values, base_policy)
        base_policy = stricter(policy, base_policy)
    mixed = {k: v for k, v in values.items() if not KEYS[k].trusted}
    mixed.update({k: v for k, v in base_values.items() if KEYS[k].trusted})
    return combine(None, env, mixed, base_policy, file=file, notes=notes)


def base_table(commit: str, cwd: Path | None) -> tuple[Values, Policy]:
    """The trusted keys' values and the policy of the base commit's configuration; none when
    it has no configuration file; Unverifiable when it cannot be read or does not load.

    A relative ``ladder`` is relative to the project's folder, as the working tree's is.
    """
    source = base_source(commit, cwd)
    if source is None:
        return {}, Policy(origin=f"base commit {commit[:12]}: no configuration file")
    try:
        return read_table(source, "" if cwd is None or str(cwd) in ("", ".") else str(cwd))
    except DlciError as exc:
        raise Unverifiable(f"it does not load: {first_problem(exc)}") from None


def base_source(commit: str, cwd: Path | None) -> TomlSource | None:
    """The base commit's configuration file for the project in ``cwd``, or None when the
    commit has none; Unverifiable when the commit cannot be read or its file does not load."""
    files, folder = open_commit(commit, cwd, CONFIG_LIMIT)
    found: list[TomlSource] = []
    for name in (DLCI_TOML, PYPROJECT):
        rel = posixpath.normpath(posixpath.join(folder, name))
        try:
            _, text = files.read(rel)
        except Unverifiable as exc:
            if "is not in the base commit" in str(exc):
                continue
            raise
        try:
            source = from_text(name, text, f"base commit {commit[:12]}:{rel}")
        except DlciError as exc:
            raise Unverifiable(f"it does not load: {first_problem(exc)}") from None
        if source is not None:
            found.append(source)
    if len(found) == 2:
        raise Unverifiable(f"both {found[0].display} and {found[1].display} configure dl-ci")
    return found[0] if found else None


def first_problem(exc: DlciError) -> str:
    """The first located problem of a file that does not load, and how many more it has.

    >>> from dlci.schema import Problems
    >>> first_problem(Problems([DlciError("a: bad", file="f", line=1), DlciError("b: worse")]))
    'f:1: a: bad (and 1 more problem)'
    """
    more = len(exc.every()) - 1
    tail = f" (and {more} more problem{'s' if more > 1 else ''})" if more else ""
    return f"{exc.location}: {exc.message}{tail}"


def stricter(policy: Policy, base: Policy) -> Policy:
    """The base's policy less the waivers the pull request removes: a removal only makes the
    doctor stricter, and a waiver that has expired in the base would otherwise fail every pull
    request, the one that removes it too. An added or renewed waiver waits for the merge.
    """
    kept = tuple(w for w in base.waivers if policy.waiver(w.check) is not None)
    if len(kept) == len(base.waivers):
        return base
    return Policy(waivers=kept, thresholds=base.thresholds, origin=base.origin)


def changes(values: Values, policy: Policy, base_values: Values, base: Policy) -> list[str]:
    """Notes on what the working tree changes in the trusted keys and the policy."""
    notes = []
    for name in TRUSTED:
        head, old = _value(values, name), _value(base_values, name)
        if head != old:
            notes.append(
                f"the pull request changes {name} from {_text(old)} to {_text(head)}: {MERGED}"
            )
    for waiver in policy.waivers:
        was = base.waiver(waiver.check)
        if was is None:
            notes.append(f"the pull request adds a waiver for {waiver.check}: {MERGED}")
        elif (was.mode, was.reason, was.until) != (waiver.mode, waiver.reason, waiver.until):
            notes.append(f"the pull request changes the waiver for {waiver.check}: {MERGED}")
    for was in base.waivers:
        if policy.waiver(was.check) is None:
            notes.append(f"the pull request removes the waiver for {was.check}: {NOW}")
    for name in sorted(set(policy.thresholds) | set(base.thresholds)):
        head_t, old_t = policy.thresholds.get(name), base.thresholds.get(name)
        if head_t != old_t:
            notes.append(
                f"the pull request changes the threshold {name} from {_text(old_t)} to "
                f"{_text(head_t)}: {MERGED}"
            )
    return notes


def _value(values: Values, name: str) -> Any:
    return values[name][0] if name in values else KEYS[name].default


def _text(value: Any) -> str:
    return DEFAULT if value is None else f"{value:g}" if isinstance(value, float) else str(value)
