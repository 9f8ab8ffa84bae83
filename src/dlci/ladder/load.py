"""The budget ladder: its schema, loading with located errors, and tier selection.

A ladder file says, for each budget (pr, merge, nightly) and each hardware class, how much
the memorization test may spend. ``load_ladder`` turns a file into a frozen ``Ladder`` or
raises one ``DlciError`` naming the file, line and key path; ``select_tier`` is a pure
function from a ladder, a budget and a hardware class to a ``Tier``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import asdict
from importlib import resources
from pathlib import Path
from typing import Any

from dlci.errors import DlciError
from dlci.ladder import format as fmt
from dlci.ladder import patterns
from dlci.ladder.format import (
    CLASS_FIELDS,
    REQUIRED_BUDGETS,
    TIER_FIELDS,
    TOP_KEYS,
    FieldSpec,
)
from dlci.ladder.model import CPU_CLASS, HardwareClass, Ladder, Tier, TierRow
from dlci.ladder.versions import check_thresholds, check_version, data_version, keep_absolute
from dlci.ladder.yamlsource import KeyPath, YamlSource, chain_link, load_yaml, parse_yaml

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
    data = source.data
    fmt.check_keys(source, (), data, TOP_KEYS, required=("version", "classes", "budgets"))
    revision = data.get("revision", "")
    if not isinstance(revision, str | int | float) or isinstance(revision, bool):
        raise source.error(("revision",), f"expected a text, got {fmt.kind(revision)}")
    classes = _build_classes(source, fmt.mapping(source, ("classes",), data["classes"]))
    budgets = _build_budgets(source, fmt.mapping(source, ("budgets",), data["budgets"]), classes)
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


def _build_classes(source: YamlSource, raw: dict[str, Any]) -> dict[str, HardwareClass]:
    if not raw:
        raise source.error(
            ("classes",), "no hardware class is declared", hint="declare at least 'cpu'"
        )
    classes: dict[str, HardwareClass] = {}
    for name, body in raw.items():
        path: KeyPath = ("classes", name)
        fmt.check_name(source, path, name)
        values = _fields(source, path, fmt.mapping(source, path, body), CLASS_FIELDS)
        for index, pattern in enumerate(values["match"]):
            why = patterns.problem(pattern)
            if why:
                raise source.error(
                    (*path, "match", index),
                    f"GPU name pattern {pattern!r} refused: {why}",
                    hint=patterns.HINT,
                )
        classes[name] = HardwareClass(
            name=name,
            match=tuple(values["match"]),
            speed=float(values["speed"]),
            fallback=values["fallback"],
            description=values["description"],
        )
    for cls in classes.values():
        if cls.fallback is not None and cls.fallback not in classes:
            raise source.error(
                ("classes", cls.name, "fallback"),
                f"unknown hardware class {cls.fallback!r}",
                hint=fmt.suggest(cls.fallback, classes, "classes"),
            )
    if CPU_CLASS not in classes:
        raise source.error(
            ("classes",),
            f"the '{CPU_CLASS}' class is missing",
            hint="declare 'cpu' (match: [], speed: 0.02); it is the class of a runner with no GPU",
        )
    return classes


def _build_budgets(
    source: YamlSource, raw: dict[str, Any], classes: Mapping[str, HardwareClass]
) -> dict[str, dict[str, TierRow | None]]:
    for required in REQUIRED_BUDGETS:
        if required not in raw:
            raise source.error(
                ("budgets",),
                f"budget '{required}' is missing",
                hint="a ladder defines at least the pr, merge and nightly budgets",
            )
    budgets: dict[str, dict[str, TierRow | None]] = {}
    for budget, body in raw.items():
        fmt.check_name(source, ("budgets", budget), budget)
        rows: dict[str, TierRow | None] = {}
        for cls, row in fmt.mapping(source, ("budgets", budget), body).items():
            path: KeyPath = ("budgets", budget, cls)
            if cls not in classes:
                raise source.error(
                    path,
                    f"unknown hardware class {cls!r}",
                    hint=fmt.suggest(str(cls), classes, "classes"),
                )
            if row is None:  # explicitly: this budget does not run on this class
                rows[cls] = None
                continue
            values = _fields(source, path, fmt.mapping(source, path, row), TIER_FIELDS)
            check_thresholds(source, path, values, version=data_version(source))
            rows[cls] = TierRow(**values)
        owners = _row_classes(rows, classes)
        for cls in [cls for cls in classes if owners[cls] is None][:1]:
            raise source.error(
                ("budgets", budget),
                f"no tier for hardware class '{cls}', and the class has no fallback",
                hint=f"add budgets.{budget}.{cls}, give classes.{cls} a 'fallback', or write "
                f"'{cls}: null' if this budget must not run on it",
            )
        budgets[budget] = rows
    return budgets


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


def _fields(
    source: YamlSource, path: KeyPath, raw: dict[str, Any], specs: tuple[FieldSpec, ...]
) -> dict[str, Any]:
    known = {spec.name: spec.description for spec in specs}
    fmt.check_keys(source, path, raw, known, required=())
    values: dict[str, Any] = {}
    for spec in specs:
        if spec.name not in raw:
            if spec.required:
                raise source.error(
                    path, f"missing required key '{spec.name}'", hint=f"{spec.name}: {spec.hint}"
                )
            values[spec.name] = spec.default
            continue
        value = fmt.check_value(source, (*path, spec.name), raw[spec.name], spec)
        if spec.kind in ("number", "int"):
            value = float(value) if spec.kind == "number" else int(value)
        values[spec.name] = value
    return values


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
