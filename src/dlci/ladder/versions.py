"""The ladder format's versions: which a file may be, and what reading an older one means.

Version 1 rows state an absolute ``max_loss``; version 2 rows may state ``max_relative_loss``
(a share of the starting loss, ladder/goal.py), ``max_loss`` or both. A version 1 file that
extends a version 2 one keeps its own rows absolute and is told what changed.
"""

from __future__ import annotations

from typing import Any

from dlci.ladder import format as fmt
from dlci.ladder.format import CURRENT_VERSION, FORMAT_DOC, SUPPORTED_VERSIONS, THRESHOLD_KEYS
from dlci.ladder.yamlsource import KeyPath, YamlSource


def check_version(source: YamlSource) -> YamlSource:
    data = source.data
    if not isinstance(data, dict):
        raise source.error(
            (),
            f"the ladder must be a mapping with version, classes and budgets, got {fmt.kind(data)}",
            hint=f"see {FORMAT_DOC} for the format",
        )
    if "version" not in data:
        raise source.error(
            (),
            "version: required key is missing",
            hint=f"start the file with 'version: {CURRENT_VERSION}'",
        )
    version = data["version"]
    if isinstance(version, bool) or not isinstance(version, int):
        raise source.error(
            ("version",),
            f"expected an integer, got {fmt.show(version)} ({fmt.kind(version)})",
            hint=f"write 'version: {CURRENT_VERSION}'",
        )
    if version not in SUPPORTED_VERSIONS:
        readable = " and ".join(str(v) for v in SUPPORTED_VERSIONS)
        raise source.error(
            ("version",),
            f"unsupported ladder version {version}; this dl-ci reads versions {readable}",
            hint=f"upgrade dl-ci, or write the file in the version {CURRENT_VERSION} format "
            f"({FORMAT_DOC})",
        )
    return source


def data_version(source: YamlSource) -> int:
    version = source.data.get("version", 1) if isinstance(source.data, dict) else 1
    return version if isinstance(version, int) else 1


def check_thresholds(
    source: YamlSource, path: KeyPath, values: dict[str, Any], *, version: int
) -> None:
    """A row states a threshold; version 1 knows only the absolute one."""
    if version < 2 and values["max_relative_loss"] is not None:
        raise source.error(
            (*path, "max_relative_loss"),
            "max_relative_loss needs ladder version 2",
            hint=f"write 'version: {CURRENT_VERSION}' at the top of the file",
        )
    if all(values[key] is None for key in THRESHOLD_KEYS):
        hint = (
            "max_loss: use a positive loss such as 1.0"
            if version < 2
            else "max_relative_loss: 0.1 (the loss falls to a tenth of its start), "
            "max_loss: 1.0, or both"
        )
        missing = "'max_loss'" if version < 2 else "'max_loss' or 'max_relative_loss'"
        raise source.error(path, f"missing required key {missing}", hint=hint)


def keep_absolute(merged: Any, overlay: Any, file: str, parent: str) -> list[str]:
    """A version 1 file over a version 2 one: its rows keep their meaning, absolute only.

    A row the older file states with ``max_loss`` drops the ``max_relative_loss`` it would
    inherit (version 1 had none); the rows it does not state are the newer file's, relative.
    """
    kept = []
    budgets = overlay.get("budgets") if isinstance(overlay, dict) else None
    for budget, rows in (budgets or {}).items():
        for cls, row in (rows or {}).items() if isinstance(rows, dict) else ():
            target = merged.get("budgets", {}).get(budget, {}).get(cls)
            stated = isinstance(row, dict) and "max_loss" in row and isinstance(target, dict)
            if stated and target.pop("max_relative_loss", None) is not None:
                kept.append(f"budgets.{budget}.{cls}")
    note = (
        f"{file} is a version 1 ladder over {parent}, which is version {CURRENT_VERSION}: "
        "rows it does not state now mean the loss falls to a share of its start "
        "(max_relative_loss)"
    )
    if kept:
        note += f"; its own rows keep their absolute max_loss ({', '.join(kept)})"
    return [note + f"; every pass also needs the loss to halve from its start ({FORMAT_DOC})"]
