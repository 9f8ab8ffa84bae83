"""The budget ladder: its schema, loading with located errors, and tier selection.

A ladder file says, for each budget (pr, merge, nightly) and each hardware class, how much
the memorization test may spend. ``load_ladder`` turns a file into a frozen ``Ladder`` or
raises one ``DlciError`` naming the file, line and key path; ``select_tier`` is a pure
function from a ladder, a budget and a hardware class to a ``Tier``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import asdict
from importlib import resources
from pathlib import Path
from typing import Any

from dlci import schema
from dlci.errors import DlciError
from dlci.ladder import format as fmt
from dlci.ladder import patterns
from dlci.ladder.format import REQUIRED_BUDGETS, TOP_KEYS, ClassFields, TierFields
from dlci.ladder.model import CPU_CLASS, HardwareClass, Ladder, Tier, TierRow
from dlci.ladder.versions import check_thresholds, check_version, data_version, keep_absolute
from dlci.ladder.yamlsource import KeyPath, YamlSource, chain_link, dotted, load_yaml, parse_yaml
from dlci.schema import Problem

# the data classes live in dlci.ladder.model; their old import path here keeps working
__all__ = [
    "CPU_CLASS",
    "DEFAULT_LADDER",
    "EVENT_BUDGETS",
    "HardwareClass",
    "Ladder",
    "Tier",
    "TierRow",
    "check_budget",
    "default_ladder_path",
    "load_ladder",
    "load_ladder_text",
    "resolve_budget",
    "select_tier",
]

DEFAULT_LADDER = "default"
DEFAULT_DISPLAY = "default:budgets/ladder.yaml"  # how messages name the shipped ladder

# GITHUB_EVENT_NAME -> budget, for --budget auto. Anything else runs the PR budget.
EVENT_BUDGETS: dict[str, str] = {
    "pull_request": "pr",
    "pull_request_target": "pr",
    "push": "merge",
    "merge_group": "merge",
    "schedule": "nightly",
    "workflow_dispatch": "nightly",
}


# --------------------------------------------------------------------------- loading


def default_ladder_path() -> Path:
    """The ladder shipped inside the package (budgets/ladder.yaml in the repository)."""
    return Path(str(resources.files("dlci") / "data" / "ladder.yaml"))


def load_ladder(path: str | os.PathLike[str] | None = None) -> Ladder:
    """Load and validate a ladder file; ``None`` or ``"default"`` loads dl-ci's own.

    >>> ladder = load_ladder()
    >>> ladder.version, sorted(ladder.budgets)
    (2, ['merge', 'nightly', 'pr'])
    """
    if path is None or str(path) == DEFAULT_LADDER:
        source = _read_chain(default_ladder_path(), DEFAULT_DISPLAY, ())
        return build_ladder(source, DEFAULT_LADDER)
    return build_ladder(_read_chain(Path(path), str(path), ()), str(path))


def load_ladder_text(text: str, name: str = "ladder.yaml") -> Ladder:
    """Load a ladder from YAML text (``extends`` paths resolve against the working directory)."""
    source = check_version(parse_yaml(text, name))
    return build_ladder(_extend(source, Path.cwd(), ()), name)


def _read_chain(path: Path, display: str, seen: tuple[Path, ...]) -> YamlSource:
    resolved = path.resolve()
    if resolved in seen:
        raise DlciError(
            f"{display}: 'extends' loops back to this file",
            hint="remove the cycle in the 'extends' chain",
            file=display,
        )
    source = check_version(load_yaml(path, display))
    return _extend(source, path.parent, (*seen, resolved))


def _extend(source: YamlSource, base_dir: Path, seen: tuple[Path, ...]) -> YamlSource:
    return extend(source, lambda ref: _read_chain(base_dir / ref, str(base_dir / ref), seen))


def extend(source: YamlSource, read_parent: Callable[[str], YamlSource]) -> YamlSource:
    """``source`` merged over the ladder it ``extends``; ``read_parent`` reads a file reference.

    ``extends: default`` is always the shipped ladder; any other reference is read (with its
    own chain) by ``read_parent``: from the working tree, or from a commit (ladder.trust).
    """
    data = source.data
    if "extends" not in data:
        return source
    parent_ref = data["extends"]
    if not isinstance(parent_ref, str) or not parent_ref.strip():
        raise source.error(
            ("extends",),
            f"expected 'default' or a file path, got {fmt.show(parent_ref)} "
            f"({fmt.kind(parent_ref)})",
            hint="write 'extends: default' to start from dl-ci's own ladder",
        )
    with chain_link(source):  # at most MAX_EXTENDS files, from the tree or from a commit
        if parent_ref == DEFAULT_LADDER:
            parent = _read_chain(default_ladder_path(), DEFAULT_DISPLAY, ())
        else:
            parent = read_parent(parent_ref)
    overlay = {k: v for k, v in data.items() if k != "extends"}
    merged = _merge(parent.data, overlay)
    notes = parent.notes
    if data.get("version") == 1 and parent.data.get("version", 1) >= 2:
        merged["version"] = parent.data["version"]
        notes = (*notes, *keep_absolute(merged, overlay, source.file, parent.file))
    lines = {**parent.lines, **source.lines}
    files = (*parent.files, source.file)
    return YamlSource(data=merged, file=source.file, lines=lines, files=files, notes=notes)


def _merge(base: Any, overlay: Any) -> Any:
    """Overlay mappings key by key; anything else in ``overlay`` replaces ``base``."""
    if isinstance(base, dict) and isinstance(overlay, dict):
        merged = dict(base)
        for key, value in overlay.items():
            merged[key] = _merge(base[key], value) if key in base else value
        return merged
    return overlay


# --------------------------------------------------------------------------- validation


def build_ladder(source: YamlSource, name: str) -> Ladder:
    """The ladder ``source`` holds, or every mistake in it at once (each located)."""
    data, errors = source.data, _Errors(source)
    errors.extend(schema.unknown_keys(data, TOP_KEYS))
    for key in ("classes", "budgets"):
        if key not in data and not schema.misspelt(key, data):
            errors.add((), f"missing required key '{key}'", TOP_KEYS[key])
    revision = data.get("revision", "")
    if not isinstance(revision, str | int | float) or isinstance(revision, bool):
        errors.add(("revision",), f"expected a text, got {fmt.kind(revision)}")
    classes = _build_classes(errors, data["classes"]) if "classes" in data else {}
    budgets = _build_budgets(errors, data["budgets"], classes) if "budgets" in data else {}
    schema.raise_all(errors.found)
    return Ladder(
        source=name,
        files=source.files,
        version=data["version"],
        revision=str(revision),
        classes=classes,
        budgets=budgets,
        lines=dict(source.lines),
        notes=source.notes,
    )


class _Errors:
    """The located mistakes found so far in one ladder."""

    def __init__(self, source: YamlSource) -> None:
        self.source = source
        self.found: list[DlciError] = []

    def add(self, path: KeyPath, problem: str, hint: str | None = None) -> None:
        self.found.append(self.source.error(path, problem, hint=hint))

    def extend(self, problems: list[Problem]) -> None:
        for p in problems:
            self.add(p.path, p.message, p.hint)

    def mapping(self, path: KeyPath, value: Any) -> dict[str, Any] | None:
        if isinstance(value, dict):
            return value
        self.add(
            path,
            f"expected a mapping, got {fmt.show(value)} ({fmt.kind(value)})",
            f"see {fmt.FORMAT_DOC} for the layout of '{dotted(path[:1])}'",
        )
        return None

    def name(self, path: KeyPath, name: Any) -> None:
        if not _valid_name(name):
            self.add(
                path,
                f"invalid name {fmt.show(name)}",
                "use lower-case letters, digits, '-', '_' or '.', such as 'a100' or 'rtx-4090'",
            )


def _valid_name(name: Any) -> bool:
    return isinstance(name, str) and re.fullmatch(fmt.NAME_PATTERN, name) is not None


def _build_classes(errors: _Errors, body: Any) -> dict[str, HardwareClass]:
    """The well-formed classes; a class with a mistake is left out (its mistakes recorded)."""
    raw = errors.mapping(("classes",), body)
    if raw is None:
        return {}
    if not raw:
        errors.add(("classes",), "no hardware class is declared", "declare at least 'cpu'")
    classes: dict[str, HardwareClass] = {}
    for name, value in raw.items():
        path: KeyPath = ("classes", name)
        before = len(errors.found)
        errors.name(path, name)
        body = errors.mapping(path, value)
        if body is None:
            continue
        values, problems = schema.check(ClassFields, body, path)
        errors.extend(problems)
        for index, pattern in enumerate(values["match"] or () if not problems else ()):
            why = patterns.problem(pattern)
            if why:
                errors.add(
                    (*path, "match", index),
                    f"GPU name pattern {pattern!r} refused: {why}",
                    patterns.HINT,
                )
        if len(errors.found) == before:
            classes[name] = HardwareClass(name=name, **{**values, "match": tuple(values["match"])})
    for name, value in raw.items():
        fallback = value.get("fallback") if isinstance(value, dict) else None
        if isinstance(fallback, str) and fallback not in raw:
            errors.add(
                ("classes", name, "fallback"),
                f"unknown hardware class {fallback!r}",
                fmt.suggest(fallback, list(raw), "classes"),
            )
    if CPU_CLASS not in raw:
        errors.add(
            ("classes",),
            f"the '{CPU_CLASS}' class is missing",
            "declare 'cpu' (match: [], speed: 0.02); it is the class of a runner with no GPU",
        )
    return classes


def _build_budgets(
    errors: _Errors, body: Any, classes: Mapping[str, HardwareClass]
) -> dict[str, dict[str, TierRow | None]]:
    """Each budget's rows; a row with a mistake is left out (its mistakes recorded)."""
    raw = errors.mapping(("budgets",), body)
    if raw is None:
        return {}
    for required in REQUIRED_BUDGETS:
        if required not in raw:
            errors.add(
                ("budgets",),
                f"budget '{required}' is missing",
                "a ladder defines at least the pr, merge and nightly budgets",
            )
    # the classes rows may name (None: not judged, when the classes' names are in doubt); a
    # missing 'cpu' is reported once, under classes, not again at every row naming it
    declared = errors.source.data.get("classes")
    named = isinstance(declared, dict) and all(_valid_name(name) for name in declared)
    declared = {CPU_CLASS: None, **declared} if named else None
    whole = not errors.found  # only over sound classes is a missing row worth naming
    budgets: dict[str, dict[str, TierRow | None]] = {}
    for budget, value in raw.items():
        before = len(errors.found)
        errors.name(("budgets", budget), budget)
        rows = _build_rows(errors, budget, errors.mapping(("budgets", budget), value), declared)
        if whole and len(errors.found) == before:
            _check_coverage(errors, budget, rows, classes)
        budgets[budget] = rows
    return budgets


def _build_rows(
    errors: _Errors, budget: str, raw: dict[str, Any] | None, declared: Mapping[str, Any] | None
) -> dict[str, TierRow | None]:
    rows: dict[str, TierRow | None] = {}
    for cls, row in (raw or {}).items():
        path: KeyPath = ("budgets", budget, cls)
        if declared is not None and cls not in declared:
            errors.add(
                path,
                f"unknown hardware class {cls!r}",
                fmt.suggest(str(cls), list(declared), "classes"),
            )
            continue
        body = None if row is None else errors.mapping(path, row)
        if body is None:  # null: explicitly, this budget does not run on this class
            rows[cls] = None
            continue
        values, problems = schema.check(TierFields, body, path)
        errors.extend(problems)
        try:
            if not problems:
                check_thresholds(errors.source, path, values, version=data_version(errors.source))
                rows[cls] = TierRow(**values)
        except DlciError as exc:
            errors.found.append(exc)
    return rows


def _check_coverage(
    errors: _Errors,
    budget: str,
    rows: Mapping[str, TierRow | None],
    classes: Mapping[str, HardwareClass],
) -> None:
    """Each class runs this budget by its own row or a fallback's, or is refused (null)."""
    owners = _row_classes(rows, classes)
    for cls in [cls for cls in classes if owners[cls] is None][:1]:
        errors.add(
            ("budgets", budget),
            f"no tier for hardware class '{cls}', and the class has no fallback",
            f"add budgets.{budget}.{cls}, give classes.{cls} a 'fallback', or write "
            f"'{cls}: null' if this budget must not run on it",
        )


def _row_classes(
    rows: Mapping[str, TierRow | None], classes: Mapping[str, HardwareClass]
) -> dict[str, str | None]:
    """Each class -> the class whose row it uses (its own, else along its fallback chain), or
    None. Each class is visited once: thousands of chained classes cost no more than their size."""
    owner: dict[str, str | None] = {cls: cls for cls in rows if cls in classes}
    for start in classes:
        chain: list[str] = []
        current: str | None = start
        while current is not None and current not in owner:
            owner[current] = None  # on the chain being followed: a loop ends here
            chain.append(current)
            current = classes[current].fallback
        owner.update(dict.fromkeys(chain, owner[current] if current is not None else None))
    return owner


# --------------------------------------------------------------------------- selection


def resolve_budget(requested: str, *, event_name: str | None) -> tuple[str, str]:
    """Turn ``auto`` into a budget by the GitHub event; return ``(budget, reason)``.

    >>> resolve_budget("auto", event_name="schedule")
    ('nightly', 'budget auto: GITHUB_EVENT_NAME=schedule selects nightly')
    >>> resolve_budget("auto", event_name=None)
    ('pr', 'budget auto: not a GitHub event; pr is the default')
    """
    if requested != "auto":
        return requested, f"budget {requested}: given"
    if not event_name:
        return "pr", "budget auto: not a GitHub event; pr is the default"
    budget = EVENT_BUDGETS.get(event_name, "pr")
    known = event_name in EVENT_BUDGETS
    why = "selects" if known else "is not a scheduled, push or PR event; using"
    return budget, f"budget auto: GITHUB_EVENT_NAME={event_name} {why} {budget}"


def check_budget(ladder: Ladder, budget: str) -> None:
    """Refuse a budget the ladder lacks, before anything slow (GPU detection) runs.

    >>> check_budget(load_ladder(), "nosuch")
    Traceback (most recent call last):
    dlci.errors.DlciError: ladder 'default': unknown budget 'nosuch'; choose from pr, merge, nightly
      hint: or pass auto, which follows GITHUB_EVENT_NAME
    """
    if budget in ladder.budgets:
        return
    names = list(ladder.budgets)
    close = fmt.closest(budget, names)
    raise DlciError(
        f"ladder {ladder.source!r}: unknown budget {budget!r}; choose from {', '.join(names)}",
        hint=(f"did you mean '{close}'? " if close else "")
        + "or pass auto, which follows GITHUB_EVENT_NAME",
    )


def select_tier(
    ladder: Ladder,
    *,
    budget: str,
    hardware_class: str,
    reasons: tuple[str, ...] = (),
    warnings: tuple[str, ...] = (),
) -> Tier:
    """Pick the tier of ``budget`` for ``hardware_class`` (a class the ladder declares)."""
    check_budget(ladder, budget)
    if hardware_class not in ladder.classes:
        raise DlciError(
            f"ladder {ladder.source!r}: unknown hardware class {hardware_class!r}",
            hint=fmt.suggest(hardware_class, ladder.classes, "classes in this ladder"),
        )
    row_class = _row_classes(ladder.budgets[budget], ladder.classes)[hardware_class]
    assert row_class is not None, "load_ladder guarantees every class resolves"
    row = ladder.budgets[budget][row_class]
    if row is None:
        file, line = ladder.where("budgets", budget, row_class)
        raise DlciError(
            f"the ladder does not allow budget '{budget}' on hardware class '{row_class}' "
            f"(budgets.{budget}.{row_class} is null)",
            hint="run on a runner of another class, choose another budget, or give that row "
            "a tier in your own ladder (--ladder)",
            file=file,
            line=line,
        )
    notes = list(reasons)
    if row_class != hardware_class:
        notes.append(
            f"budget {budget} has no row for {hardware_class}; using its fallback {row_class}"
        )
    return Tier(
        budget=budget,
        hardware_class=hardware_class,
        **asdict(row),
        ladder=ladder.source,
        ladder_version=ladder.version,
        ladder_revision=ladder.revision,
        row=f"budgets.{budget}.{row_class}",
        reasons=tuple(notes),
        warnings=(*warnings, *ladder.notes),
    )
