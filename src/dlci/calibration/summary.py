"""calibration.json's shape, and calibration.md: the proposal next to the current rows, the
power table, the seeds.

calibration.json is a :class:`CalibrationReport` from the writer (calibration/write.py) to every
reader: a file read back (a nightly job's artifact) becomes one through :func:`read`, which names
each field of a wrong type before anything reads it. calibration.md is made from it alone; the
nightly workflow appends it to the job summary, so a team sees when its ladder drifts from what
its model now needs.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec
from msgspec import UNSET, UnsetType

from dlci import jsonio, schema
from dlci.report.text import md, md_code, table

SCHEMA_VERSION = 1
REPORT_NAME = "calibration.json"

# A loss as the report writes it: a number, or text for NaN and the infinities
Loss = Annotated[float | Literal["nan", "inf", "-inf"], msgspec.Meta(extra={"words": "a number"})]


class Shape(msgspec.Struct, kw_only=True):
    """A part of calibration.json; every field has its writer's type."""


class CurrentRow(Shape):
    """A budget's current row, and its failure rates on the calibration's seeds."""

    row: str = ""
    max_epochs: int = 0
    max_loss: float | None = None
    max_relative_loss: float = 0.0
    time_cap_minutes: float = 0.0
    failures: int = 0
    estimated_rate: float | None = None  # null: not estimable
    upper_bound: float | None = None
    distribution_free_upper_bound: float = 1.0
    median_epochs: float | None = None
    slowest_epochs: int = 0


class ProposedRow(Shape):
    """The row proposed for a budget, its failure rates, and what it catches."""

    max_epochs: int = 0
    max_relative_loss: float = 0.0
    time_cap_minutes: float = 0.0
    profile_steps: int = 0
    nproc: int = 1
    batch_size: int = 0
    failures: int = 0
    estimated_rate: float | None = None
    upper_bound: float | None = None
    distribution_free_upper_bound: float = 1.0
    median_epochs: float | None = None
    slowest_epochs: int = 0
    seeds_needed: int = 0
    detectable_slowdown: float | None = None
    over_allowance: bool = False


class CandidateEntry(Shape):
    """One threshold of the grid, and why it was or was not chosen."""

    max_relative_loss: float = 0.0
    reached: int = 0
    epochs: int | None = None
    median_epochs: float | None = None
    slowdown: float | None = None
    fits: bool = False
    why: str = ""


class BudgetEntry(Shape):
    """One budget: its current row, the proposal (null when the seeds support none), and,
    with a proposal, each seed's epochs to its threshold and loss at its epochs."""

    current: CurrentRow = msgspec.field(default_factory=CurrentRow)
    proposal: ProposedRow | None = None
    notes: list[str] = []
    thresholds_tried: int = 1
    confidence_each: float = 0.95
    candidates: list[CandidateEntry] = []
    epochs_to_threshold: list[int | None] | UnsetType = UNSET
    final_losses: list[float | None] | UnsetType = UNSET


class RunEntry(Shape):
    """One seed's run, as its record (calibration/runs.py) has it: the figures it has."""

    seed: int = 0
    steps: int | UnsetType = UNSET
    stopped_by: str | UnsetType = UNSET
    wall_time_s: float | UnsetType = UNSET
    setup_time_s: float | UnsetType = UNSET
    applied: str | UnsetType = UNSET
    not_applicable: str | UnsetType = UNSET
    losses: list[Loss] = []


class Judgement(Shape):
    """What a row does to one sabotaged run: caught or not, at which epoch, and how."""

    caught: bool
    epoch: int
    how: str  # passed, nonfinite, time, epochs


class PowerRows(Shape):
    """A variant's runs judged by a budget's current row, and by its proposed one (when
    there is one); None for a run the variant does not apply to."""

    current: list[Judgement | None] = []
    proposed: list[Judgement | None] | UnsetType = UNSET


class PowerEntry(Shape):
    """One sabotaged variant: its runs, and how each budget's rows treat them."""

    variant: str = ""
    what: str = ""
    runs: list[RunEntry] = []
    budgets: dict[str, PowerRows] = {}


class LadderEntry(Shape):
    source: str = ""
    revision: str = ""


class CalibrationReport(Shape):
    """calibration.json (schema_version 1); docs/calibration.md describes every key."""

    schema_version: int = SCHEMA_VERSION
    kind: str = "calibration"
    target: str = ""
    hardware_class: str = ""
    device: str = ""
    versions: dict[str, str | None] = {}
    ladder: LadderEntry = msgspec.field(default_factory=LadderEntry)
    seeds: list[int] = []
    epochs_ceiling: int = 0
    batch_size: int = 0
    false_failure_rate: float = 0.0
    confidence: float = 0.0
    method: dict[str, str] = {}
    workers: int = 1
    torch_threads: int = 1
    step_time_s: float = 0.0
    wall_time_s: float = 0.0
    runs: list[RunEntry] = []
    budgets: dict[str, BudgetEntry] = {}
    power: list[PowerEntry] = []
    warnings: list[str] = []


def read(raw: Any, name: str = REPORT_NAME) -> CalibrationReport:
    """A decoded calibration.json as a :class:`CalibrationReport`; ValueError naming each
    field of a wrong type (``name``, the file, and its key path), or a value no field holds.

    >>> read({"seeds": [0, 1], "budgets": {"pr": {"proposal": None}}}).budgets["pr"].notes
    []
    >>> read({"seeds": ["0"], "budgets": {"pr": {"current": {"max_epochs": 9.5}}}})
    Traceback (most recent call last):
    ValueError: calibration.json: seeds[0] is '0', expected an integer; calibration.json: \
budgets.pr.current.max_epochs is 9.5, expected an integer
    """
    wrong = problems(CalibrationReport, raw, name)
    if wrong:
        raise ValueError("; ".join(wrong))
    try:
        return msgspec.convert(raw, CalibrationReport)
    except msgspec.ValidationError as exc:  # the types are right: a value out of range
        raise ValueError(f"{name} cannot be read: {exc}") from None


def problems(cls: type[msgspec.Struct], raw: Any, name: str, limit: int = 5) -> list[str]:
    """Each field of ``raw`` whose JSON type is not the one ``cls`` declares, in words that
    name the file (``name``) and the key path; the first ``limit``, then a line for the rest
    (the walk stops there: a hostile file can hold millions of wrong items)."""
    if not isinstance(raw, dict):
        return [f"{name} is not an object"]
    found = [
        f"{name}: {where} is {jsonio.describe(value)}, expected {words}"
        for where, value, words in itertools.islice(schema.mismatches(cls, raw), limit + 1)
    ]
    if len(found) > limit:
        found = [*found[:limit], f"{name}: more fields of wrong types"]
    return found


def _pct(value: float | None, bound: bool = False) -> str:
    """A rate in percent; None (not estimable) as n/a.

    >>> _pct(0.0123), _pct(None), _pct(0.17, bound=True), _pct(2e-9, bound=True)
    ('1.23%', 'n/a', '<= 17%', '< 0.0001%')
    """
    if value is None:
        return "n/a"
    if value < 1e-6:
        return "< 0.0001%"
    text = f"{value * 100:.3g}%"
    return f"<= {text}" if bound else text


def _row_cells(label: str, row: CurrentRow | ProposedRow, seeds: int) -> list[str]:
    slowdown = row.detectable_slowdown if isinstance(row, ProposedRow) else None
    if slowdown is None and row.median_epochs:
        slowdown = row.max_epochs / row.median_epochs
    return [
        label,
        f"{row.max_relative_loss:g}",
        str(row.max_epochs),
        f"{row.time_cap_minutes:g} min",
        _pct(row.estimated_rate),
        _pct(row.upper_bound, bound=True),
        f"{_pct(row.distribution_free_upper_bound, bound=True)} ({row.failures}/{seeds} failed)",
        f"{slowdown:.2f}x" if slowdown else "n/a",
    ]


def _budgets(report: CalibrationReport) -> list[str]:
    seeds = len(report.seeds)
    rows = []
    for budget, entry in report.budgets.items():
        current = entry.current
        rows.append([md(budget), *_row_cells(f"current ({md(current.row)})", current, seeds)])
        if entry.proposal:
            rows.append([md(budget), *_row_cells("**proposed**", entry.proposal, seeds)])
        else:
            rows.append([md(budget), "**no proposal**", *[""] * 7])
    headers = [
        "budget",
        "row",
        "max_relative_loss",
        "max_epochs",
        "time cap",
        "healthy failures (estimate)",
        f"bound ({report.confidence:.0%})",
        "distribution-free bound",
        "slowdown it catches",
    ]
    return table(headers, rows)


def _power(report: CalibrationReport) -> list[str]:
    if not report.power:
        return ["No power table (--power-seeds 0)."]
    budgets = list(report.budgets)
    headers = ["variant", *[f"{md(b)} {k}" for b in budgets for k in ("current", "proposed")]]
    rows = []
    for entry in report.power:
        cells = [md(entry.what)]
        for budget in budgets:
            judged = entry.budgets.get(budget, PowerRows())
            cells += [_verdicts(judged.current), _verdicts(judged.proposed)]
        rows.append(cells)
    return table(headers, rows)


def _verdicts(judged: list[Judgement | None] | UnsetType) -> str:
    """How a row treats one variant's seeds: caught (at which epoch) or missed.

    >>> _verdicts([Judgement(caught=True, epoch=20, how="epochs"), None])
    'caught 1/1 (at epoch 20); n/a 1'
    >>> _verdicts([Judgement(caught=False, epoch=6, how="passed")])
    'missed 1/1 (passes at epoch 6)'
    """
    if judged is UNSET:
        return ""
    runs = [j for j in judged if j is not None]
    caught = [j for j in runs if j.caught]
    missed = [j for j in runs if not j.caught]
    parts = []
    if caught:
        epochs = ", ".join(str(j.epoch) for j in caught)
        parts.append(f"caught {len(caught)}/{len(runs)} (at epoch {epochs})")
    if missed:
        epochs = ", ".join(str(j.epoch) for j in missed)
        parts.append(f"missed {len(missed)}/{len(runs)} (passes at epoch {epochs})")
    if len(runs) < len(judged):
        parts.append(f"n/a {len(judged) - len(runs)}")
    return "; ".join(parts)


def proposed(report: CalibrationReport) -> dict[str, tuple[BudgetEntry, ProposedRow]]:
    """The budgets with a proposal: each one's entry and its proposed row."""
    return {b: (e, e.proposal) for b, e in report.budgets.items() if e.proposal}


def _seeds(report: CalibrationReport) -> list[str]:
    rows_of = proposed(report)
    headers = [
        "seed",
        *[f"{md(b)}: epochs to {row.max_relative_loss:g}" for b, (_, row) in rows_of.items()],
    ]
    headers += ["best loss", "steps"]
    rows = []
    for index, run in enumerate(report.runs):
        finite = [v for v in run.losses if isinstance(v, float | int)]
        cells = [str(run.seed)]
        for entry, _ in rows_of.values():
            epochs = entry.epochs_to_threshold
            known = isinstance(epochs, list) and index < len(epochs)
            cells.append(str(epochs[index]) if isinstance(epochs, list) and known else "n/a")
        cells += [f"{min(finite):.3g}" if finite else "n/a", str(run.steps or 0)]
        rows.append(cells)
    return table(headers, rows)


def render_markdown(report: CalibrationReport, files: dict[str, Path]) -> str:
    """The calibration as Markdown; its outside text escaped."""
    seeds = report.seeds
    first, last = (seeds[0], seeds[-1]) if seeds else ("n/a", "n/a")
    lines = [
        f"### Calibration of {md_code(report.target)} on class {md(report.hardware_class)}",
        "",
        f"{len(seeds)} seeds ({first} to {last}), up to {report.epochs_ceiling} epochs "
        f"each on a batch of {report.batch_size}, on {md(report.device)} (torch "
        f"{md(report.versions.get('torch') or 'n/a')}); {report.workers} worker(s), "
        f"{report.wall_time_s:.1f} s. Target: at most {_pct(report.false_failure_rate)} "
        f"of healthy runs fail, at {report.confidence:.0%} confidence.",
        "",
        *_budgets(report),
        "",
        "The estimate and its bound assume log-normal epochs to threshold across seeds; the "
        "distribution-free bound assumes nothing and needs many seeds to be small "
        f"({_needed(report)}). A change that makes learning slower than the last column fails "
        "the gate. docs/calibration.md explains the method.",
        "",
        "#### Power: sabotaged variants of the same target",
        "",
        *_power(report),
        "",
        "#### Seeds",
        "",
        *_seeds(report),
    ]
    if report.warnings:
        lines += ["", "#### Warnings", ""] + [f"- {md(w)}" for w in report.warnings]
    lines += ["", f"Files: {', '.join(md_code(p.name) for p in files.values())}."]
    return "\n".join(lines) + "\n"


def _needed(report: CalibrationReport) -> str:
    needed = [row.seeds_needed for _, row in proposed(report).values()]
    if not needed:
        return "no row was proposed"
    return f"{max(needed)} seeds, all passing, would bound it by {_pct(report.false_failure_rate)}"
