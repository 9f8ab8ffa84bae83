"""The calibration's files: calibration.json first; ladder.yaml, calibration.md and
calibration.png are made from it, never from a second computation."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

from dlci import jsonio
from dlci.calibration import runs
from dlci.calibration.plot import plot
from dlci.calibration.propose import (
    TIME_FLOOR_MINUTES,
    TIME_MARGIN,
    Proposal,
    current_share,
    step_time,
)
from dlci.calibration.stats import Bound, epochs_to, seeds_needed
from dlci.calibration.summary import (
    SCHEMA_VERSION,
    BudgetEntry,
    CalibrationReport,
    CandidateEntry,
    CurrentRow,
    LadderEntry,
    PowerEntry,
    ProposedRow,
    RunEntry,
    proposed,
    render_markdown,
)
from dlci.fsutil import atomic_write_text
from dlci.report.memorization import library_versions
from dlci.report.text import clean

REPORT_NAME, LADDER_NAME = "calibration.json", "ladder.yaml"
MARKDOWN_NAME, PLOT_NAME = "calibration.md", "calibration.png"
METHOD = {
    "threshold": "of the current relative threshold (max_relative_loss; 0.5 for a row that states "
    "only max_loss) and the 1-2-5 values below it, each curve taken as shares of its start above "
    "the target's floor, that every seed reached after its first step, the one whose epochs "
    "bound is within the current row's max_epochs with the "
    "smallest detectable slowdown (bound / median epochs to it); ties go to the lower loss",
    "epochs": "one-sided normal tolerance bound of log(epochs to threshold) over the seeds "
    "(non-central t factor), at least the slowest seed; each threshold at confidence "
    "1 - (1 - C) / m, m the size of the threshold grid (Bonferroni)",
    "estimated_rate": "the fitted log-normal's tail beyond max_epochs",
    "upper_bound": "the failure rate whose tolerance bound is max_epochs, at the same confidence",
    "distribution_free": "Clopper-Pearson upper bound on the seeds that failed the row "
    "(order statistics: valid for any distribution), at the same confidence",
    "time_cap": f"{TIME_MARGIN:g} x the slowest seed's seconds per step x max_epochs, "
    f"at least {TIME_FLOOR_MINUTES:g} minute",
}


def _num(value: float | None) -> float | None:
    """JSON has no NaN: a rate that cannot be estimated is null."""
    return None if value is None or not math.isfinite(value) else value


def _rates(row: Row, found: Bound) -> Row:
    """``row`` with the failure rates of ``found`` (the same seeds, its threshold)."""
    row.failures = found.failures
    row.estimated_rate = _num(found.estimated_rate)
    row.upper_bound = _num(found.upper_rate)
    row.distribution_free_upper_bound = found.free_upper_rate
    row.median_epochs = _num(found.median)
    row.slowest_epochs = found.slowest
    return row


Row = TypeVar("Row", CurrentRow, ProposedRow)


def budget_entry(p: Proposal, curves: Sequence[Sequence[float]], rate: float) -> BudgetEntry:
    """One budget's part of calibration.json."""
    tier = p.tier
    current = CurrentRow(
        row=tier.row,
        max_epochs=tier.max_epochs,
        max_loss=tier.max_loss,
        max_relative_loss=current_share(tier),
        time_cap_minutes=tier.time_cap_minutes,
    )
    entry = BudgetEntry(
        current=_rates(current, p.current),
        notes=list(p.notes),
        thresholds_tried=p.tried,
        confidence_each=p.each,
        candidates=[
            CandidateEntry(
                max_relative_loss=c.threshold,
                reached=c.reached,
                epochs=c.epochs,
                median_epochs=c.median,
                slowdown=c.slowdown,
                fits=c.fits,
                why=c.why,
            )
            for c in p.candidates
        ],
    )
    if p.row is None or p.bound is None or p.row.max_relative_loss is None:
        return entry
    limit = p.row.max_epochs
    proposal = ProposedRow(
        max_epochs=p.row.max_epochs,
        max_relative_loss=p.row.max_relative_loss,
        time_cap_minutes=p.row.time_cap_minutes,
        profile_steps=p.row.profile_steps,
        nproc=p.row.nproc,
        batch_size=p.row.batch_size,
        seeds_needed=seeds_needed(rate, p.each),
        detectable_slowdown=p.slowdown,
        over_allowance=p.over_allowance,
    )
    entry.proposal = _rates(proposal, p.bound)
    share = p.row.max_relative_loss
    entry.epochs_to_threshold = [epochs_to(c, share) for c in curves]
    entry.final_losses = [_num(c[min(limit, len(c)) - 1]) if c else None for c in curves]
    return entry


def build_report(
    *,
    request: Any,
    spec: str,
    ladder: Any,
    proposals: Sequence[Proposal],
    records: Sequence[runs.Record],
    power: list[PowerEntry],
    pool: runs.Pool,
    wall_s: float,
) -> CalibrationReport:
    """calibration.json (schema_version 1)."""
    curves = [runs.relative(r) for r in records]
    first = records[0]
    return CalibrationReport(
        schema_version=SCHEMA_VERSION,
        kind="calibration",
        target=spec,
        hardware_class=proposals[0].tier.hardware_class,
        device=first.device or "",
        versions=library_versions(),
        ladder=LadderEntry(source=ladder.source, revision=ladder.revision),
        seeds=[r.job.seed for r in records],
        epochs_ceiling=first.job.epochs,
        batch_size=first.job.batch_size,
        false_failure_rate=request.rate,
        confidence=request.confidence,
        method=METHOD,
        workers=pool.workers,
        torch_threads=pool.threads,
        step_time_s=step_time([r.wall_time_s or 0.0 for r in records], [r.steps for r in records]),
        wall_time_s=round(wall_s, 2),
        runs=[run_entry(r) for r in records],
        budgets={p.budget: budget_entry(p, curves, request.rate) for p in proposals},
        power=power,
        warnings=_warnings(records, proposals),
    )


def run_entry(record: runs.Record) -> RunEntry:
    """A run's record as calibration.json lists it: its seed, figures and curve."""
    return RunEntry(
        seed=record.job.seed,
        steps=record.steps,
        stopped_by=record.stopped_by,
        wall_time_s=record.wall_time_s,
        setup_time_s=record.setup_time_s,
        applied=record.applied,
        not_applicable=record.not_applicable,
        losses=record.losses,
    )


def _warnings(records: Sequence[runs.Record], proposals: Sequence[Proposal]) -> list[str]:
    found = []
    if len({json.dumps(r.losses) for r in records}) == 1:
        found.append(
            f"all {len(records)} seeds gave the same loss curve: the target's randomness does "
            "not follow the seed (a fixed torch.Generator, or a seed set inside the factory), "
            "so the calibration measured one run; the bounds assume the seeds differ"
        )
    timed = [r.job.seed for r in records if r.stopped_by == "time"]
    if timed:
        found.append(f"seed(s) {timed} stopped at their time cap before the epoch ceiling")
    for p in proposals:
        found.extend(f"{p.budget}: {note}" for note in p.notes)
    return found


def ladder_text(report: CalibrationReport, base: str) -> str:
    """ladder.yaml: the proposed rows for this class over ``base``, a comment on each row."""
    cls = report.hardware_class
    seeds = len(report.seeds)
    lines = [
        f"# Written by dlci calibrate: {seeds} seeds of {clean(report.target)} on class "
        f"{cls} ({clean(report.device)}, torch {clean(report.versions.get('torch') or 'n/a')}).",
        f"# A row fails at most {report.false_failure_rate:.2%} of healthy runs, at "
        f"{report.confidence:.0%} confidence (log-normal model); calibration.md explains.",
        "version: 2",
        f"extends: {json.dumps(base)}",
        f"revision: {json.dumps(f'calibrated-{cls}-{seeds}-seeds')}",
        "budgets:",
    ]
    rows_of = proposed(report)
    if not rows_of:
        lines[-1] += " {}"
    for budget, (entry, row) in rows_of.items():
        lines.append(f"  {json.dumps(budget)}:")
        lines.extend(f"    # {text}" for text in _row_comment(report, entry.current, row))
        fields = ", ".join(
            f"{key}: {_yaml_number(value)}"
            for key, value in (
                ("max_epochs", row.max_epochs),
                ("max_relative_loss", row.max_relative_loss),
                ("time_cap_minutes", row.time_cap_minutes),
                ("profile_steps", row.profile_steps),
                ("nproc", row.nproc),
            )
        )
        lines.append(f"    {json.dumps(cls)}: {{{fields}, batch_size: {row.batch_size}}}")
    return "\n".join(lines) + "\n"


def _row_comment(report: CalibrationReport, current: CurrentRow, row: ProposedRow) -> list[str]:
    seeds = len(report.seeds)
    slowdown = row.detectable_slowdown or 0.0
    return [
        f"max_relative_loss {row.max_relative_loss:g}: the share of the start with the "
        "smallest detectable slowdown "
        f"({slowdown:.2f}x the median seed's epochs) within "
        f"{current.max_epochs} epochs (the current row, {current.row})",
        f"max_epochs {row.max_epochs}: tolerance bound of the epochs to it over {seeds} "
        f"seeds (median {row.median_epochs:g}, slowest {row.slowest_epochs})",
        f"time_cap_minutes {row.time_cap_minutes:g}: {TIME_MARGIN:g} x "
        f"{report.step_time_s * 1000:.3g} ms per step x max_epochs, at least "
        f"{TIME_FLOOR_MINUTES:g}; profile_steps, nproc, batch_size: the current row's",
    ]


def _yaml_number(value: float) -> str:
    """A number YAML 1.1 reads back as one: PyYAML takes '1e-05' for text, '1.0e-05' not.

    >>> _yaml_number(1e-05), _yaml_number(0.5), _yaml_number(16), _yaml_number(2.0)
    ('1.0e-05', '0.5', '16', '2.0')
    """
    if isinstance(value, int):
        return str(value)
    text = repr(float(value))
    mantissa, sep, exponent = text.partition("e")
    if sep and "." not in mantissa:
        return f"{mantissa}.0e{exponent}"
    return text


def ladder_base(ladder: str | None, out: Path) -> str:
    """What the written ladder extends: 'default', or the given ladder relative to OUT."""
    if ladder is None or ladder == "default":
        return "default"
    return os.path.relpath(os.path.abspath(ladder), os.path.abspath(out))


def write_all(out: Path, report: CalibrationReport, ladder: str | None) -> dict[str, Path]:
    """Every file of the calibration into ``out``; their paths by name."""
    files = {
        "json": out / REPORT_NAME,
        "ladder": out / LADDER_NAME,
        "markdown": out / MARKDOWN_NAME,
        "plot": out / PLOT_NAME,
    }
    atomic_write_text(files["json"], jsonio.encode(report).decode())
    atomic_write_text(files["ladder"], ladder_text(report, ladder_base(ladder, out)))
    atomic_write_text(files["markdown"], render_markdown(report, files))
    plot(report, files["plot"])
    return files
