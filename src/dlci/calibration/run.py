"""What ``dlci calibrate`` does: the seeds' runs, the proposal per budget, the power table,
and the files (calibration.json, ladder.yaml, calibration.md, calibration.png)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from msgspec import UNSET

from dlci.calibration import runs, write
from dlci.calibration.power import VARIANTS
from dlci.calibration.propose import Proposal, current_share, propose_budget, step_time
from dlci.calibration.stats import epochs_to
from dlci.calibration.summary import CalibrationReport, Judgement, PowerEntry, PowerRows
from dlci.errors import DlciError
from dlci.ladder.load import check_budget, load_ladder, select_tier
from dlci.ladder.model import Ladder, Tier
from dlci.ladder.tiers import resolve_class
from dlci.memorization.request import check_out
from dlci.training.target import resolve_spec

Say = Callable[[str], None]
MAX_SEEDS = 1000  # past the 299 seeds a distribution-free 1% bound needs
MAX_EPOCHS = 1_000_000
RUN_CAP_FACTOR = 4  # a calibration run may take this many times the largest current time cap


@dataclass(frozen=True)
class CalibrationRequest:
    """What ``dlci calibrate`` was asked for, its options as parsed."""

    target: str | None = None
    budget: str = "all"
    hardware: str = "auto"
    ladder: str | None = None
    detection: dict[str, Any] = field(default_factory=dict)  # hardware.detect's options
    seeds: int = 16
    first_seed: int = 0
    rate: float = 0.01
    confidence: float = 0.95
    epochs: int | None = None  # the ceiling of each run; None: twice the largest max_epochs
    workers: int | None = None  # None: one per GPU, else one per CPU core
    power_seeds: int = 2
    device: str | None = None
    out: str = "dlci-calibration"


@dataclass
class CalibrationOutcome:
    report: CalibrationReport
    files: dict[str, Path]


def check_request(request: CalibrationRequest) -> None:
    """Every option in its bounds, before anything is loaded or run."""
    limits: list[tuple[str, float, bool]] = [
        ("--seeds", request.seeds, 2 <= request.seeds <= MAX_SEEDS),
        ("--false-failure-rate", request.rate, 0 < request.rate < 0.5),
        ("--confidence", request.confidence, 0.5 <= request.confidence < 1),
        ("--power-seeds", request.power_seeds, 0 <= request.power_seeds <= request.seeds),
        ("--first-seed", request.first_seed, 0 <= request.first_seed < 2**31),
    ]
    if request.epochs is not None:
        limits.append(("--epochs", request.epochs, 2 <= request.epochs <= MAX_EPOCHS))
    if request.workers is not None:
        limits.append(("--workers", request.workers, 1 <= request.workers <= 256))
    hints = {
        "--seeds": f"use 2 to {MAX_SEEDS} seeds; 16 is the default",
        "--false-failure-rate": "use a rate above 0 and below 0.5, such as 0.01 (1%)",
        "--confidence": "use a confidence from 0.5 up to (not including) 1, such as 0.95",
        "--power-seeds": "use 0 (no power table) up to --seeds",
        "--first-seed": "use a seed from 0 to 2**31 - 1",
        "--epochs": f"use 2 to {MAX_EPOCHS} epochs",
        "--workers": "use 1 to 256 workers, or leave it out (one per GPU, else per core)",
    }
    for option, value, ok in limits:
        if not (ok and math.isfinite(value)):
            raise DlciError(f"{option} {value:g} is out of bounds", hint=hints[option])


def run_calibration(request: CalibrationRequest, say: Say) -> CalibrationOutcome:
    """Calibrate the chosen budgets' rows for this machine's hardware class."""
    check_request(request)
    check_out(request.out)
    spec = resolve_spec(request.target)
    ladder = load_ladder(request.ladder)
    tiers = _tiers(request, ladder)
    out = Path(request.out)
    started = time.perf_counter()
    epochs = request.epochs or 2 * max(t.max_epochs for t in tiers)
    cap_s = RUN_CAP_FACTOR * 60 * max(t.time_cap_minutes for t in tiers)
    seeds = list(range(request.first_seed, request.first_seed + request.seeds))
    healthy = [runs.Job(spec, s, epochs, tiers[0].batch_size, cap_s) for s in seeds]
    pool = runs.plan_pool(request.workers, len(healthy), request.device)
    say(
        f"{len(healthy)} seeds of {spec} on class {tiers[0].hardware_class}, up to {epochs} "
        f"epochs each; {pool.workers} worker(s) on {', '.join(pool.devices)}, "
        f"{pool.threads} torch thread(s) each"
    )
    with runs.Workers(pool) as workers:
        records = _run_phase(healthy, workers, out, say)
        proposals = _propose(request, tiers, healthy, records)
        power = _power(request, spec, proposals, seeds, epochs, cap_s, workers, out, say)
    report = write.build_report(
        request=request,
        spec=spec,
        ladder=ladder,
        proposals=proposals,
        records=[records[job.name] for job in healthy],
        power=power,
        pool=pool,
        wall_s=time.perf_counter() - started,
    )
    return CalibrationOutcome(report, write.write_all(out, report, request.ladder))


def _propose(
    request: CalibrationRequest,
    tiers: Sequence[Tier],
    healthy: Sequence[runs.Job],
    records: dict[str, runs.Record],
) -> list[Proposal]:
    """Each budget's proposal from the seeds' curves."""
    curves = [runs.relative(records[job.name]) for job in healthy]
    step_s = step_time(
        [records[j.name].wall_time_s or 0.0 for j in healthy],
        [records[j.name].steps for j in healthy],
    )
    return [
        propose_budget(curves, t, rate=request.rate, confidence=request.confidence, step_s=step_s)
        for t in tiers
    ]


def _tiers(request: CalibrationRequest, ladder: Ladder) -> list[Tier]:
    """The current row of each chosen budget for this machine's class (detected; a class
    given with --hardware must be the one detected: the runs measure this machine)."""
    names = list(ladder.budgets) if request.budget == "all" else [request.budget]
    for name in names:
        check_budget(ladder, name)
    detected = resolve_class("auto", ladder, **request.detection)
    if request.hardware != "auto":
        given = resolve_class(request.hardware, ladder, **request.detection)
        if given.name != detected.name:
            raise DlciError(
                f"--hardware {request.hardware}: this machine is of class {detected.name} "
                f"({detected.reason}); its runs would not measure class {given.name}",
                hint=f"run dlci calibrate on a {given.name} runner, or leave --hardware out",
            )
    tiers = []
    for name in names:
        try:
            tiers.append(select_tier(ladder, budget=name, hardware_class=detected.name))
        except DlciError:  # the row is null: this class may not run this budget
            if request.budget != "all":
                raise
    if not tiers:
        raise DlciError(f"the ladder allows no budget on class {detected.name}")
    sizes = sorted({t.batch_size for t in tiers})
    if len(sizes) > 1:
        raise DlciError(
            f"the chosen budgets memorize batches of different sizes ({sizes})",
            hint="calibrate one budget at a time with --budget",
        )
    return tiers


def _run_phase(
    jobs: Sequence[runs.Job], workers: runs.Workers, out: Path, say: Say
) -> dict[str, runs.Record]:
    """Every job's record: those kept in OUT/runs/ from before, and the rest run now."""
    env = runs.environment(workers.pool.devices[0])
    records = runs.kept_runs(out, jobs, env, say)
    todo = [job for job in jobs if job.name not in records]
    if records:
        say(f"kept {len(records)} finished run(s) from {out / runs.RUNS_DIR}")
    started = time.perf_counter()

    def done(record: runs.Record) -> None:
        runs.save(out, record)
        job = record.job
        records[job.name] = record
        finished = len(records)
        best = min((v for v in runs.losses(record) if math.isfinite(v)), default=math.nan)
        say(
            f"{job.describe()} done ({finished}/{len(jobs)}, "
            f"{time.perf_counter() - started:.1f} s): best loss {best:.3g} "
            f"in {record.steps} steps"
        )

    workers.run(todo, done)
    return records


def _power(
    request: CalibrationRequest,
    spec: str,
    proposals: Sequence[Proposal],
    seeds: Sequence[int],
    ceiling: int,
    cap_s: float,
    workers: runs.Workers,
    out: Path,
    say: Say,
) -> list[PowerEntry]:
    """The sabotaged variants' curves, judged by each budget's proposed and current rows."""
    if not request.power_seeds:
        return []
    longest = max(max(p.tier.max_epochs, p.row.max_epochs if p.row else 0) for p in proposals)
    epochs = min(ceiling, longest)
    batch = proposals[0].tier.batch_size
    jobs = [
        runs.Job(spec, s, epochs, batch, cap_s, variant)
        for variant in VARIANTS
        for s in seeds[: request.power_seeds]
    ]
    say(f"power: {len(VARIANTS)} sabotaged variants x {request.power_seeds} seed(s)")
    records = _run_phase(jobs, workers, out, say)
    table = []
    for variant, what in VARIANTS.items():
        mine = [records[j.name] for j in jobs if j.variant == variant]
        entry = PowerEntry(variant=variant, what=what, runs=[write.run_entry(r) for r in mine])
        for p in proposals:
            judged = PowerRows(current=_judged(mine, p.tier.max_epochs, current_share(p.tier)))
            if p.row is not None and p.row.max_relative_loss is not None:
                judged.proposed = _judged(mine, p.row.max_epochs, p.row.max_relative_loss)
            entry.budgets[p.budget] = judged
        table.append(entry)
    return table


def _judged(mine: Sequence[runs.Record], max_epochs: int, share: float) -> list[Judgement | None]:
    """Each run judged by one row; None for a run the variant does not apply to."""
    return [
        judge(runs.relative(r), max_epochs, share) if r.not_applicable is UNSET else None
        for r in mine
    ]


def judge(curve: Sequence[float], max_epochs: int, share: float) -> Judgement:
    """What the gate with this row does to one variant's relative curve: caught, and when.

    >>> judge([2.0, 1.5, 0.8], 2, 1.0)
    Judgement(caught=True, epoch=2, how='epochs')
    >>> judge([2.0, 0.5], 5, 1.0)
    Judgement(caught=False, epoch=2, how='passed')
    """
    reached = epochs_to(curve[:max_epochs], share)
    if reached is not None:
        return Judgement(caught=False, epoch=reached, how="passed")
    bad = next((i + 1 for i, v in enumerate(curve[:max_epochs]) if not math.isfinite(v)), None)
    if bad is not None:
        return Judgement(caught=True, epoch=bad, how="nonfinite")
    if len(curve) < max_epochs:  # the calibration run itself stopped early (its time cap)
        return Judgement(caught=True, epoch=len(curve), how="time")
    return Judgement(caught=True, epoch=max_epochs, how="epochs")
