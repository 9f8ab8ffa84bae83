"""One run's reports as a side of a comparison, each field the comparison reads checked.

Host-side (no torch). The reports are outside input (a baseline's artifact, a folder, the
nightly history's reports), read under caps: a report that is unreadable or malformed is
left out, with the reason, and the comparison goes on without it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dlci import jsonio
from dlci.action.host.testfiles import coverage_rate
from dlci.compare.diff import Environment
from dlci.compare.runs import check_run
from dlci.errors import DlciError
from dlci.fsutil import read_input
from dlci.jsonio import describe
from dlci.report import memorization as memorization_report
from dlci.report import utilization as utilization_report
from dlci.report.fields import Memorization, Utilization

MAX_LOSSES = 100_000  # points of a memorization curve read from a report


@dataclass
class Side:
    """One run's reports, as far as they are there and well formed."""

    utilization: Utilization | None = None
    memorization: Memorization | None = None
    coverage: float | None = None
    hardware_class: str | None = None
    left_out: list[str] = field(default_factory=list)
    preflight: dict[str, Any] | None = None  # this run's: the host's copy, with its config

    def environment(self) -> Environment:
        """The hardware class and torch version this run reported (None: unknown)."""
        versions = self.memorization.config.versions if self.memorization else {}
        return Environment(hardware_class=self.hardware_class, torch=versions.get("torch"))


def read_json(path: Path) -> Any:
    return jsonio.decode(read_input(path, what="report"))


def checked(path: Path, kind: str, side: Side) -> dict[str, Any] | None:
    """A report of ``kind`` from ``path`` whose fields the comparison reads are sound."""
    if not path.is_file():
        return None
    try:
        data = read_json(path)
    except (DlciError, jsonio.DecodeError, RecursionError) as exc:
        side.left_out.append(f"{path.name}: unreadable ({str(exc)[:200]})")
        return None
    if not isinstance(data, dict) or data.get("kind") != kind:
        side.left_out.append(f"{path.name}: not a {kind} report")
        return None
    check = utilization_report.check_compared if kind == "utilization" else _check_memorization
    problem = check(data) or (check_run(data) if kind == "memorization" else None)
    if problem:
        side.left_out.append(f"{path.name}: {problem}")
        return None
    return data


def checked_utilization(path: Path, side: Side) -> Utilization | None:
    """utilization.json from ``path`` checked (:func:`checked`), then read into its classes."""
    data = checked(path, "utilization", side)
    try:
        return None if data is None else utilization_report.read(data)
    except ValueError as exc:  # the types are checked: a required field is missing
        side.left_out.append(str(exc))  # "utilization.json is incomplete: ..."
        return None


def checked_memorization(path: Path, side: Side) -> Memorization | None:
    """A memorization report from ``path`` checked as :func:`checked` does, then read into its
    classes (a field of a type dl-ci does not write leaves it out, named)."""
    data = checked(path, "memorization", side)
    if data is None:
        return None
    try:
        return memorization_report.read(data)
    except ValueError as exc:
        side.left_out.append(str(exc)[:400])
        return None


def _check_memorization(report: dict[str, Any]) -> str | None:
    """The fields the comparison reads beyond :func:`check_run`'s: threshold, tier, losses."""
    threshold, tier = report.get("threshold"), report.get("tier")
    if threshold is not None and number(threshold) is None:
        return f"threshold: expected a number, got {describe(threshold)}"
    if tier is not None and not isinstance(tier, dict):
        return f"tier: expected an object, got {describe(tier)}"
    losses = report.get("losses")
    if losses is None:
        return None
    if not isinstance(losses, list) or len(losses) > MAX_LOSSES:
        return f"losses: expected a list of at most {MAX_LOSSES} numbers"
    for i, value in enumerate(losses):  # null or "nan"/"inf": a diverged run's, as written
        if value is not None and not isinstance(value, str) and number(value) is None:
            return f"losses[{i}]: expected a number, got {describe(value)}"
    return None


def base_side(folder: Path) -> Side:
    """The baseline's reports from ``folder`` (outside input: every field checked)."""
    side = Side()
    side.utilization = checked_utilization(folder / "utilization.json", side)
    side.memorization = checked_memorization(folder / "memorization.json", side)
    side.coverage = coverage_rate(folder / "coverage.xml")
    if side.coverage is not None and not 0 <= side.coverage <= 100:  # also nan
        side.left_out.append(f"coverage.xml: line-rate {side.coverage / 100:.3g} is not 0 to 1")
        side.coverage = None
    try:
        preflight = (
            read_json(folder / "preflight.json") if (folder / "preflight.json").is_file() else {}
        )
    except (DlciError, jsonio.DecodeError, RecursionError):
        preflight = {}
    side.hardware_class = hardware_class(preflight, side.memorization)
    return side


def hardware_class(preflight: Any, memorization: Memorization | None) -> str | None:
    tier = preflight.get("tier") if isinstance(preflight, dict) else None
    value = tier.get("hardware_class") if isinstance(tier, dict) else None
    if value is None and memorization is not None:
        value = memorization.tier.hardware_class or None  # "": the report names none
    return str(value)[:80] if isinstance(value, str) else None


def number(value: Any) -> float | None:
    """A number from a report as a float: None for anything else, an integer beyond 64 bits
    (no float holds 10**400), or NaN and the infinities."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, int):
        return float(value) if abs(value) < 2**63 else None
    return value if math.isfinite(value) else None
