"""What a project may change about the doctor: waivers per check and check thresholds.

Plain data, no torch: ``dlci.config`` builds a :class:`Policy` from ``[tool.dlci]`` (or, on a
pull request under the action, from the base commit's configuration); ``run_doctor`` applies
it. :data:`THRESHOLDS` is the one table of the thresholds a project may set, with their
defaults and the range a value must lie in; the checks read their values through
:meth:`Policy.threshold`.
"""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, cast

import msgspec
from msgspec import UNSET, UnsetType

from dlci.schema import meta

# The doctor's checks in the order it runs them (dlci.checks builds its ladder in this order,
# tests/test_doctor.py holds the two equal): here, where the host's configuration and its
# bookkeeping of the gates read them without loading the checks.
CHECK_IDS = (
    "optimizer-coverage",
    "initial-loss",
    "loss-broadcast",
    "train-eval-mode",
    "zero-grad",
    "grad-flow",
    "shuffle",
    "input-normalization",
    "batch-independence",
    "causality",
    "activations",
    "weight-norms",
    "update-ratio",
    "memorize",
    "input-dependence",
    "lr-range",
    "label-alignment",
    "leakage",
    "reproducibility",
)

SKIP_WAIVER, WARN_ONLY = "skip", "warn-only"
WAIVER_MODES = (SKIP_WAIVER, WARN_ONLY)


@dataclass(frozen=True)
class Threshold:
    """One threshold of one check: its key under ``[tool.dlci.doctor.checks.<check>]``."""

    check: str  # a check ID
    key: str  # kebab-case, e.g. "fail-rms"
    default: float
    low: float  # the smallest value allowed
    high: float  # the largest value allowed
    meaning: str  # one line for docs/configuration.md and ``dlci config``

    @property
    def name(self) -> str:
        return f"{self.check}.{self.key}"


_T = Threshold
# Every threshold of a check that a project may reasonably tune, its default the value the
# check has always used (docs/doctor.md gives the reasoning behind each). Sample sizes and
# step counts are not here: they size the measurement, they do not judge it.
# fmt: off
THRESHOLDS: tuple[Threshold, ...] = (
    _T("initial-loss", "warn-low", 0.7, 0.0, 1.0,
       "warns when the initial loss is under this times ln C"),
    _T("initial-loss", "warn-high", 1.5, 1.0, 100.0,
       "warns when the initial loss is over this times ln C"),
    _T("initial-loss", "fail-low", 0.5, 0.0, 1.0,
       "fails when the initial loss is under this times ln C"),
    _T("initial-loss", "fail-high", 3.0, 1.0, 100.0,
       "fails when the initial loss is over this times ln C"),
    _T("grad-flow", "warn-norm", 1e3, 1.0, 1e12,
       "warns when the largest first-step gradient norm is over this"),
    _T("shuffle", "warn-mix", 0.75, 0.0, 1.0,
       "classification: warns when a batch holds under this share of the classes a shuffled "
       "batch would"),
    _T("shuffle", "fail-mix", 0.5, 0.0, 1.0,
       "classification: fails when a batch holds under this share of the classes a shuffled "
       "batch would"),
    _T("shuffle", "warn-order", 0.8, 0.5, 1.0,
       "regression: warns when over this share of neighbouring targets are in order"),
    _T("shuffle", "fail-order", 0.95, 0.5, 1.0,
       "regression: fails when over this share of neighbouring targets are in order"),
    _T("input-normalization", "warn-rms", 10.0, 1.0, 1e6,
       "warns when a feature's root mean square is over this"),
    _T("input-normalization", "fail-rms", 30.0, 1.0, 1e6,
       "fails when a feature's root mean square is over this"),
    _T("input-normalization", "warn-dominance", 100.0, 1.0, 1e12,
       "warns when one dense feature's rms is over this times the median feature's"),
    _T("input-normalization", "warn-shift", 0.3, 0.0, 100.0,
       "warns when the held-out means are over this many training sds from the training means "
       "(median over features, beyond the noise)"),
    _T("input-normalization", "fail-shift", 1.0, 0.0, 100.0,
       "fails when the held-out means are over this many training sds from the training means "
       "(median over features, beyond the noise)"),
    _T("input-normalization", "warn-sd-ratio", 1.5, 1.0, 1e6,
       "warns when the held-out sds are over this many times the training sds, either way "
       "(median over features, beyond the noise)"),
    _T("input-normalization", "fail-sd-ratio", 3.0, 1.0, 1e6,
       "fails when the held-out sds are over this many times the training sds, either way "
       "(median over features, beyond the noise)"),
    _T("input-normalization", "fail-one-shift", 5.0, 0.0, 1e6,
       "fails when one dense feature's held-out mean is over this many training sds from its "
       "training mean"),
    _T("batch-independence", "tolerance", 1e-4, 0.0, 1.0,
       "the largest output difference allowed, as a share of the output scale"),
    _T("activations", "warn-share", 0.4, 0.0, 1.0,
       "warns when this share of a layer's units are dead or saturated"),
    _T("activations", "fail-share", 0.5, 0.0, 1.0,
       "fails when this share of a layer's units are dead or saturated"),
    _T("weight-norms", "warn-growth", 3.0, 1.0, 1e6,
       "warns when a weight tensor's norm grows over this factor in the first steps"),
    _T("weight-norms", "fail-growth", 10.0, 1.0, 1e6,
       "fails when a weight tensor's norm grows over this factor in the first steps"),
    _T("update-ratio", "warn-low", 1e-5, 0.0, 1.0,
       "warns when a tensor's median update is under this share of its weights"),
    _T("update-ratio", "fail-low", 1e-7, 0.0, 1.0,
       "fails when even the largest median update is under this share of the weights"),
    _T("update-ratio", "warn-high", 0.1, 0.0, 1e6,
       "warns when a tensor's median update is over this share of its weights"),
    _T("update-ratio", "fail-high", 0.3, 0.0, 1e6,
       "fails when a tensor's median update is over this share of its weights"),
    _T("update-ratio", "fail-largest", 1.0, 0.0, 1e6,
       "fails when one step's update is over this share of the weights"),
    _T("lr-range", "fail-above", 10.0, 1.0, 1e6,
       "fails when the configured rate is over this times the lowest-loss rate"),
    _T("lr-range", "fail-below", 100.0, 1.0, 1e6,
       "fails when the configured rate is under a hundredth of the steepest rate divided by this"),
    _T("label-alignment", "warn-gain", 0.1, -1.0, 1.0,
       "warns when the true labels' gain over shuffled ones is under this"),
    _T("label-alignment", "fail-gain", 0.02, -1.0, 1.0,
       "fails when the true labels' gain over shuffled ones is under this"),
    _T("leakage", "near-copy", 0.05, 0.0, 1.0,
       "a held-out example this close to a training one (a share of the median distance) is a "
       "near copy"),
    _T("leakage", "warn-copies", 0.01, 0.0, 1.0,
       "warns when this share of held-out examples copy training ones, beyond the data's own "
       "repeats"),
    _T("leakage", "fail-copies", 0.05, 0.0, 1.0,
       "fails when this share of held-out examples copy training ones, beyond the data's own "
       "repeats"),
    _T("leakage", "warn-skill", 0.5, 0.0, 1.0,
       "classification: warns when one feature alone predicts the held-out labels with this skill"),
    _T("leakage", "fail-skill", 0.75, 0.0, 1.0,
       "classification: fails when one feature alone predicts the held-out labels with this skill"),
    _T("leakage", "warn-group-skill", 0.9, 0.0, 1.0,
       "classification: warns when a group of features, each singling out one class, predicts "
       "the held-out labels with this skill (and 0.1 more than the best feature alone)"),
    _T("leakage", "fail-group-skill", 0.95, 0.0, 1.0,
       "classification: fails when a group of features, each singling out one class, predicts "
       "the held-out labels with this skill (and 0.1 more than the best feature alone)"),
    _T("leakage", "warn-r2", 0.9, 0.0, 1.0,
       "regression: warns when one feature alone explains this R^2 of the held-out targets"),
    _T("leakage", "fail-r2", 0.99, 0.0, 1.0,
       "regression: fails when one feature alone explains this R^2 of the held-out targets"),
    _T("leakage", "early-score", 0.99, 0.0, 1.0,
       "fails when the held-out accuracy, R^2 or AUC reaches this after 20 training steps"),
    _T("reproducibility", "tolerance", 1e-6, 0.0, 1e3,
       "the largest parameter difference allowed between two runs with the same seed"),
)
# fmt: on


def threshold_table() -> dict[str, Threshold]:
    """``"check.key"`` -> its :class:`Threshold`."""
    return {t.name: t for t in THRESHOLDS}


class CheckTable(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """``[doctor.checks.<check-id>]``: a waiver of the check, and its thresholds."""

    waive: (
        Annotated[
            Literal["skip", "warn-only"],
            meta(
                "'skip' (the check does not run) or 'warn-only' (a failure reads as a warning).",
                "write waive = 'skip' or waive = 'warn-only'",
            ),
        ]
        | UnsetType
    ) = UNSET
    reason: (
        Annotated[
            str,
            meta(
                "Why the check is waived; required with waive, shown in every report.",
                "say why the check is wrong for this model, e.g. reason = 'BatchNorm-free model'",
                rule={"minLength": 1},  # a letter or digit, in dlci.config.validate's words
            ),
        ]
        | UnsetType
    ) = UNSET
    until: (
        Annotated[
            dt.date,
            meta(
                "The last day the waiver works (a TOML date such as 2027-01-31); after it the "
                "waiver stops working and fails the run.",
                "write until = 2027-01-31 (a TOML date)",
            ),
        ]
        | UnsetType
    ) = UNSET


def check_table(check: str) -> type[CheckTable]:
    """The declared table of one check: the waiver's keys, then the check's thresholds
    (each a number within its range, its default the check's own).

    >>> from dlci.schema import fields
    >>> [f.name for f in fields(check_table("grad-flow"))]
    ['waive', 'reason', 'until', 'warn-norm']
    """
    return _check_tables(THRESHOLDS).get(check, CheckTable)


@functools.cache
def _check_tables(table: tuple[Threshold, ...]) -> dict[str, type[CheckTable]]:
    checks: dict[str, list[Threshold]] = {}
    for t in table:
        checks.setdefault(t.check, []).append(t)
    return {
        check: cast(
            "type[CheckTable]",
            msgspec.defstruct(
                check.title().replace("-", ""),
                [(t.key.replace("-", "_"), _declared(t), t.default) for t in rows],
                bases=(CheckTable,),
                kw_only=True,
                forbid_unknown_fields=True,
                rename="kebab",
            ),
        )
        for check, rows in checks.items()
    }


def _declared(t: Threshold) -> Any:
    hint = f"{t.meaning} (default {t.default:g})"
    return Annotated[float, meta(t.meaning, hint, ge=t.low, le=t.high)]


@dataclass(frozen=True)
class Waiver:
    """A check a project has judged wrong for its model, for a reason, maybe until a date."""

    check: str
    mode: str  # "skip" (not run) or "warn-only" (a fail reads as a warning)
    reason: str
    until: dt.date | None = None
    # where it was set: "pyproject.toml:14", "base commit 1a2b3c4d5e6f:pyproject.toml:14"
    source: str = ""

    def expired(self, today: dt.date | None = None) -> bool:
        """True once ``today`` is past ``until`` (the waiver works through that day)."""
        return self.until is not None and (today or dt.date.today()) > self.until

    def to_json(self) -> dict[str, Any]:
        return {
            "check": self.check,
            "mode": self.mode,
            "reason": self.reason,
            "until": self.until.isoformat() if self.until else None,
            "source": self.source,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Waiver:
        until = data.get("until")
        return cls(
            check=str(data["check"]),
            mode=str(data["mode"]),
            reason=str(data["reason"]),
            until=dt.date.fromisoformat(until) if isinstance(until, str) and until else None,
            source=str(data.get("source") or ""),
        )


@dataclass(frozen=True)
class Policy:
    """The doctor's waivers and thresholds for one run; the default is no waiver, defaults."""

    waivers: tuple[Waiver, ...] = ()
    thresholds: Mapping[str, float] = field(default_factory=dict)  # "check.key" -> value
    origin: str = ""  # where the policy was read: "pyproject.toml", "base commit ...", "defaults"

    def threshold(self, check: str, key: str) -> float:
        """The value of one threshold: the project's, else the table's default."""
        name = f"{check}.{key}"
        if name in self.thresholds:
            return float(self.thresholds[name])
        return threshold_table()[name].default

    def waiver(self, check: str) -> Waiver | None:
        return next((w for w in self.waivers if w.check == check), None)

    def to_json(self) -> dict[str, Any]:
        return {
            "origin": self.origin,
            "waivers": [w.to_json() for w in self.waivers],
            "thresholds": dict(self.thresholds),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Policy:
        return cls(
            waivers=tuple(Waiver.from_json(w) for w in data.get("waivers") or ()),
            thresholds={str(k): float(v) for k, v in (data.get("thresholds") or {}).items()},
            origin=str(data.get("origin") or ""),
        )
