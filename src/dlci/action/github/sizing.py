"""The profile sized from the baseline: enough steps for the comparison to decide.

Host-side (no torch), before any container runs. The pull-request tier profiles 3 to 5 steps,
too few for a comparison with the base branch to tell a bound of 5 points from the steps' own
scatter: such a comparison could only say "inconclusive". When the action compares with a
baseline and a bound is set, preflight fetches the baseline's reports first and reads, in its
utilization.json, how much its steps scatter (a robust standard deviation: points of
utilization, percent of step time). The 95% interval of the change (dlci.compare.stats) is
about ``1.96 * 1.02 * sigma * sqrt(1/n + 1/m)`` on each side for n head and m base steps; the
head gets the smallest n at which that half-width is at most half the bound, so that no change
reads ``ok`` and a change of twice the bound reads ``regressed``:

    1/n <= (bound / (2 * 1.96 * 1.02 * sigma))**2 - 1/m

never fewer than the tier's own steps, never more than MAX_STEPS, and never more than
TIME_SHARE of the tier's time cap at the base's median step time. When no n can do it (the
base itself profiled too few steps for its scatter), or the cap stops short, the reason says
so and names what would: the base branch's tier profiling more steps.

`dlci preflight` sizes the plan before its one write (action/host/preflight.py): the new count
goes into the tier (preflight.json, read by the container step before any container starts;
every report is then checked against it), with a reason in its ``reasons``; the baseline is
fetched into a folder the comparison after the job reads again (``dlci baseline --base-dir``).
Best effort: whatever goes wrong is a reason, and the tier keeps its own steps. The baseline's
artifact is a trusted run's (never a pull request's: see artifacts.trusted), and whatever it
holds can only raise the count within these caps. What was decided, and why, is a
:class:`Sizing` (preflight.json's ``profile_sizing``).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import msgspec
from msgspec import UNSET, UnsetType

from dlci import jsonio
from dlci.action.github.api import ApiError, GitHub
from dlci.action.github.artifacts import JOB_ID, fetch
from dlci.compare import stats
from dlci.compare.diff import median_step_us, step_values
from dlci.errors import DlciError
from dlci.fsutil import read_input
from dlci.report import utilization
from dlci.report.fields import Utilization
from dlci.trust import host as trusted

MAX_STEPS = 50  # profiled steps at most: a trace of 50 ResNet-50 steps is ~100 MB
TIME_SHARE = 0.25  # of the tier's time cap, for the profiled steps at the base's step time
Z = 1.96  # the 95% interval's normal quantile
HL_FACTOR = 1.02  # the Hodges-Lehmann shift's spread over the mean's, at normal steps
MIN_STEPS = 4  # the fewest steps a side for a 95% interval (dlci.compare.stats)


class Needed(msgspec.Struct, kw_only=True):
    """One gated figure: its bound, the base's scatter, the head steps that decide it."""

    bound: float
    base_scatter: float
    needed: int | None  # None: no number of head steps can


class SizedFrom(msgspec.Struct, kw_only=True):
    """The baseline sized from: its run (not the folder it was fetched into: preflight.json is
    uploaded, and the runner's own paths are not the reader's business)."""

    run: int | str | None


class Sizing(msgspec.Struct, kw_only=True):
    """The profile sized from the baseline, or why not (``reason`` alone, when nothing was
    read); preflight.json's ``profile_sizing``."""

    from_: int | UnsetType = msgspec.field(default=UNSET, name="from")  # the tier's steps
    steps: int | UnsetType = UNSET  # the steps to profile
    metrics: dict[str, Needed] | UnsetType = UNSET
    time_cap_steps: int | UnsetType = UNSET
    reason: str = ""
    baseline: SizedFrom | UnsetType = UNSET


def needed_steps(base_values: list[float], bound: float, *, log: bool) -> tuple[int | None, float]:
    """(head steps needed, the base's scatter); None when no number of head steps can do it.

    >>> steady = [80.0, 81, 79, 80.5, 79.5, 80.2, 80.1, 79.9, 80, 80.3]
    >>> n, sigma = needed_steps(steady, 5.0, log=False)
    >>> n, round(sigma, 2)
    (4, 0.3)
    >>> needed_steps([70.0, 60.0, 80.0, 65.0, 75.0], 5.0, log=False)[0] is None
    True
    """
    x = stats.samples(base_values, log=log)
    m = x.size
    sigma = stats.spread(x) * (100.0 if log else 1.0)
    if m < 2 or bound <= 0:
        return None, sigma
    if sigma == 0:
        return MIN_STEPS, sigma
    room = (bound / (2 * Z * HL_FACTOR * sigma)) ** 2 - 1 / m
    if room <= 0:
        return None, sigma
    return max(MIN_STEPS, math.ceil(1 / room)), sigma


def plan(base: dict[str, Any], tier: dict[str, Any], bounds: dict[str, float | None]) -> Sizing:
    """How many steps the head should profile against ``base`` (its utilization.json, as
    decoded: it is checked and read here)."""
    current = int(tier.get("profile_steps") or 0)
    metrics: dict[str, Needed] = {}
    record = Sizing(from_=current, steps=current, metrics=metrics)
    problem = utilization.check_compared(base)
    try:
        report = None if problem else utilization.read(base)
    except ValueError as exc:  # the types are checked above: a required field is missing
        problem, report = str(exc).removeprefix("utilization.json is "), None
    if report is None:
        record.reason = f"not sized: the baseline's utilization.json: {problem}"
        return record
    gpu = report.gpu_utilization_pct is not None
    wanted: list[int] = []
    short: list[str] = []
    for key, unit, log in (("gpu_utilization_pct", "pt", False), ("duration_us", "%", True)):
        bound = bounds.get(key)
        if bound is None or not gpu:  # a CPU-only trace's figures are never gated
            continue
        n, sigma = needed_steps(step_values(report, key), bound, log=log)
        metrics[key] = Needed(bound=bound, base_scatter=round(sigma, 3), needed=n)
        if n is None:
            count = len(step_values(report, key))
            short.append(
                f"{key}: the base's {count} steps scatter ±{sigma:.1f}{unit}, too much for a "
                f"bound of {bound:g}{unit} whatever this run profiles"
            )
        else:
            wanted.append(n)
    if not metrics:
        why = "no bound set" if gpu else "a CPU-only baseline (nothing is gated)"
        record.reason = f"not sized: {why}"
        return record
    cap = _time_cap_steps(report, tier)
    steps = max(current, min(max(wanted, default=current), MAX_STEPS, cap))  # never fewer
    record.steps, record.time_cap_steps = steps, cap
    parts = [f"profile_steps {current} -> {steps}" if steps != current else
             f"profile_steps {current} kept"]  # fmt: skip
    if wanted:
        parts.append(f"{max(wanted)} needed for the comparison with the baseline to decide")
    if wanted and steps < max(wanted):
        parts.append(f"capped at {steps} (at most {MAX_STEPS}, and {TIME_SHARE:.0%} of the "
                     "tier's time cap at the base's step time)")  # fmt: skip
    parts += short
    if short:
        parts.append("profile more steps on the base branch (its tier's profile_steps)")
    record.reason = "; ".join(parts)
    return record


def _time_cap_steps(base: Utilization, tier: dict[str, Any]) -> int:
    """The steps that fit a quarter of the tier's time cap at the base's median step time
    (MAX_STEPS when either is unknown or absurd: a subnormal step time, an infinite cap)."""
    step_s = (median_step_us(base) or 0.0) / 1e6
    cap_s = float(tier.get("time_cap_minutes") or 0) * 60 * TIME_SHARE
    if not (math.isfinite(step_s) and math.isfinite(cap_s)) or step_s <= 1e-9 or cap_s <= 0:
        return MAX_STEPS
    return max(min(int(cap_s / step_s), MAX_STEPS), 1)


def size_tier(tier: dict[str, Any], base_folder: Path, bounds: dict[str, float | None]) -> Sizing:
    """Raise ``tier``'s profile_steps in place (the plan's, before preflight writes it) to
    what the baseline's reports in ``base_folder`` need, with a reason; the record."""
    utilization = base_folder / "utilization.json"
    if not utilization.is_file():
        return Sizing(reason="not sized: the baseline has no utilization.json")
    try:
        base = jsonio.decode(read_input(utilization, what="the baseline's utilization.json"))
    except (jsonio.DecodeError, DlciError, RecursionError) as exc:  # a note, not a failure
        return Sizing(reason=f"not sized: the baseline's utilization.json: {type(exc).__name__}")
    if not isinstance(base, dict):
        return Sizing(reason="not sized: the baseline's utilization.json is not an object")
    try:
        record = plan(base, tier, bounds)
    except (ArithmeticError, ValueError, RecursionError, TypeError) as exc:  # a hostile report
        return Sizing(reason=f"not sized: the baseline's utilization.json: {type(exc).__name__}")
    if record.steps != tier.get("profile_steps"):  # plan always sets steps
        tier["profile_steps"] = record.steps
        reasons = tier.get("reasons")
        kept = list(reasons) if isinstance(reasons, list) else []
        tier["reasons"] = [*kept, f"sized from the baseline: {record.reason}"]
    return record


SOURCE_FILE = "baseline-source.json"  # beside the fetched reports: which run they came from
BOUNDS = {"gpu_utilization_pct": "max-utilization-drop",
          "duration_us": "max-step-time-regression"}  # fmt: skip


def prepare(report: dict[str, Any], *, into: Path, spec: str, prefix: str, token: str) -> Sizing:
    """Fetch the baseline ``spec`` (auto or a run id) into ``into``, kept for the comparison
    after the job, and size the tier of ``report`` (dlci preflight's, before its one write)
    from it; the record. A problem is a reason, never a failure."""
    # the trusted configuration's bounds (the action's inputs first), as preflight resolved them
    bounds = {metric: trusted.number(report, key) for metric, key in BOUNDS.items()}
    if all(value is None for value in bounds.values()):
        return Sizing(reason="not sized: no bound set (max-utilization-drop, "
                "max-step-time-regression)")  # fmt: skip
    tier = report.get("tier")
    hardware = tier.get("hardware_class") if isinstance(tier, dict) else None
    if not isinstance(tier, dict) or not isinstance(hardware, str) or not hardware:
        return Sizing(reason="not sized: the plan's tier names no hardware class")
    if not (spec == "auto" or spec.isdigit()):
        return Sizing(reason=f"not sized: the baseline is auto or a run id, got {spec[:40]!r}")
    try:
        api = GitHub.from_environment(token)
    except ApiError as exc:
        return Sizing(reason=f"not sized: {exc}")
    fetched = fetch(api, spec, prefix=f"{prefix}-{hardware}-", into=into, rest=JOB_ID)
    if fetched.folder is None:
        return Sizing(reason=f"not sized: no baseline: {fetched.problem}")
    source = {**fetched.run, "artifact": fetched.artifact, "skipped": fetched.skipped,
              "passed_over": fetched.passed_over}  # fmt: skip
    jsonio.write(fetched.folder / SOURCE_FILE, source)
    record = size_tier(tier, fetched.folder, bounds)
    run = fetched.run.get("id")
    record.baseline = SizedFrom(run=run if isinstance(run, int | str) else None)
    return record
