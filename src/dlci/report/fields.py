"""The shapes of the gate reports the host renders, declared once and checked before anything
renders them.

A gate's report is written by code the pull request controls, so any field can hold any JSON
value: a string ``threshold`` crashed the job summary (``Unknown format code 'g'``), a list
where a dict was expected would crash a renderer the same way (issue 35). The host checks
every field it renders against the type dl-ci writes there (each report's shape below, on
dlci.schema); a report with a wrong one is a problem named in the summary (the report is not
shown), never a crash. A missing field is not checked here: the renderers show such a report
as incomplete, and fields no renderer reads are not declared. The doctor's report is declared
whole: its classes are also what its writer builds and its readers read (report/doctor.py).

>>> problems("memorization", {"threshold": "1.0", "tier": {"max_epochs": 3}})
['memorization.json: threshold is text, expected a number or null']
>>> problems("doctor", {"checks": [{"id": "lr", "status": {"x": 1}}]})
['doctor.json: checks[0].status is an object, expected text']
"""

from __future__ import annotations

import itertools
from typing import Annotated, Any, Literal

import msgspec
from msgspec import UNSET, UnsetType

from dlci import schema

# shown through md(): any scalar is safe, a container is not
Text = Annotated[str | int | float | bool | None, msgspec.Meta(extra={"words": "text"})]
Object = dict[str, Any]


class Shape(msgspec.Struct, kw_only=True):
    """A report's fields as the renderers read them (more fields may follow)."""


# --------------------------------------------------------------------------- memorization.json
# The memorization report is typed end to end: report/memorization.py builds these classes,
# writes them as memorization.json and reads a report back into them (memorization.read), so
# every reader reads attributes. Every field has a default: a report written before a field
# existed still reads, and so does a partial one (a reader says what it lacks:
# memorization.missing); seeds and script_mode are UNSET, so absent, unless they apply.

# A loss as the report writes it: a number, null, or text for NaN and the infinities (JSON has
# no spelling for them); named as before in messages, "a number or null".
Loss = Annotated[
    float | Literal["nan", "inf", "-inf"] | None,
    msgspec.Meta(extra={"words": "a number or null"}),
]


class TierEntry(Shape):
    """The tier the run was judged at, as dlci.ladder.model.Tier.to_dict writes it."""

    schema_version: int = 1
    budget: str = ""
    hardware_class: str = ""
    max_epochs: int = 0
    max_loss: float | None = None  # null for a relative row (ladder version 2)
    time_cap_minutes: float = 0.0
    profile_steps: int = 0
    nproc: int = 1
    batch_size: int = 0
    ladder: str = ""
    ladder_version: int = 0
    ladder_revision: str = ""
    row: str = ""
    reasons: list[str] = []
    warnings: list[str] = []
    max_relative_loss: float | None = None
    criterion: str = ""


class Hardware(Shape):
    device: str = ""
    world_size: int = 1
    gpu_name: str | None = None


class RunConfig(Shape):
    """What defines a run, for tracking and dlci compare-runs (report/memorization.run_config)."""

    target: str = ""
    seed: int = 0
    tier: Object = {}  # the tier's keys that define a run, those it has
    hardware: Hardware = msgspec.field(default_factory=Hardware)
    versions: dict[str, str | None] = {}
    hparams: Object = {}  # the target's own, and batch_examples
    changes: list[str] = []


class SeedRun(Shape):
    seed: int = 0
    verdict: str = ""
    stopped_by: str = ""
    steps: int = 0
    best_loss: Loss = None
    reason: str = ""


class SeedRuns(Shape):
    """dlci memorize --seeds K: every seed's run (memorization/seeds.py)."""

    count: int = 0
    quorum: int = 0
    passed: int = 0
    runs: list[SeedRun] = []


class Memorization(Shape):
    """memorization.json: the run's verdict and figures (memorization/verdict.py's
    MemorizeResult, less its hparams and changes, which are in ``config``)."""

    schema_version: int = 1
    kind: str = "memorization"
    created_at: str = ""
    verdict: str = ""
    reason: str = ""
    threshold: float | None = None  # absolute; null when the row is relative only
    relative_threshold: float | None = None
    threshold_form: str = ""
    config: RunConfig = msgspec.field(default_factory=RunConfig)
    tier: TierEntry = msgspec.field(default_factory=TierEntry)
    tracking: str = ""
    stopped_by: str = ""
    steps: int = 0
    best_loss: Loss = None
    best_step: int | None = None
    final_loss: Loss = None
    losses: list[Loss] = []
    wall_time_s: float = 0.0
    setup_time_s: float = 0.0
    device: str = ""
    world_size: int = 1
    batch_examples: int = 0
    start_loss: Loss = None
    relative_loss: Loss = None
    criterion: str = ""
    loss_floor: float | None = None
    floor_source: str = ""
    blind_loss: Loss = None
    measured: list[str] = []
    draws_replayed: bool = False
    judged_on: str = ""
    case: str = ""
    projected_epochs: int | None = None
    next_step: str = ""
    stuck_at: str | None = None
    stack: list[str] = []
    seeds: SeedRuns | UnsetType = UNSET  # only for dlci memorize --seeds K
    script_mode: bool | UnsetType = UNSET  # only for dlci memorize -- python ...


# --------------------------------------------------------------------------- doctor.json
# The doctor's report is typed end to end: report/doctor.py builds these classes, writes them
# as doctor.json and reads a report back into them (doctor.read), so every reader reads
# attributes. A key that is absent unless it applies (a check's waived, the report's reason)
# is UNSET, which msgspec leaves out of the JSON; the fields old reports lack have defaults.


class Waived(Shape):
    """What a check's entry says of the waiver applied to it."""

    mode: str = ""
    reason: str = ""
    until: str | None = None
    source: str = ""
    status_without_waiver: str | None = None  # None: the waiver kept the check from running


class CheckEntry(Shape):
    """One check's result, as dlci.checks.base.CheckResult holds it."""

    id: str
    status: str
    measured: str
    expected: str
    cause: str
    fix: str
    details: Object = {}  # the check's instruments, for the figures
    seconds: float = 0.0
    waived: Waived | UnsetType | None = UNSET  # only where a waiver applied
    follows: list[str] = []  # the earlier failures this one may follow from


class WaiverEntry(Shape):
    """One waiver of the project's policy, and what it did in this run."""

    check: str = ""
    mode: str = ""
    reason: str = ""
    until: str | None = None
    source: str = ""
    expired: bool = False
    applied: bool = False
    status_without_waiver: str | None = None  # None: the check did not run


class PolicyEntry(Shape):
    """Where the waivers and thresholds came from; the thresholds that are not the defaults."""

    origin: str = ""
    thresholds: dict[str, float] = {}


class DoctorReport(Shape, kw_only=True):
    """doctor.json. ``counts`` has one key per status, ``ran`` and ``following`` (older
    reports lack some: a reader defaults them)."""

    schema_version: int = 1
    kind: str = "doctor"
    created_at: str = ""
    target: str = ""
    seed: int = 0
    tier: Object = {}
    verdict: str
    counts: dict[str, int]
    checks: list[CheckEntry]
    roots: list[str] = []
    waivers: list[WaiverEntry] = []
    policy: PolicyEntry = msgspec.field(default_factory=PolicyEntry)
    reason: str | UnsetType = UNSET  # why the verdict fails; only when it does
    script_mode: bool | UnsetType = UNSET  # only for dlci doctor -- python ...


# --------------------------------------------------------------------------- utilization.json


class Trace(Shape):
    cpu_only: bool


class Steps(Shape):
    count: int
    mean_step_us: float


class Busy(Shape):
    busy_pct: float | None


class Temporal(Shape):
    idle_pct: float
    compute_pct: float
    non_compute_pct: float


class CpuOp(Shape):
    name: Text


class IdleGap(Shape):
    start_us: float
    duration_us: float
    cause: Text
    cpu_op: CpuOp | None


class CopyStats(Shape):
    count: int
    bytes: int
    time_us: float
    bandwidth_gbps: float
    exposed_us: float


class Copies(Shape):
    h2d_pageable: CopyStats
    h2d_pinned: CopyStats
    h2d_other: CopyStats


class Device(Shape):
    device: Text
    name: Text
    gpu_utilization_pct: float | None
    busy: Busy
    temporal_breakdown: Temporal
    idle_gaps: list[IdleGap]
    copies: Copies


class SyncCall(Shape):
    call: Text
    caller: Text
    count: int
    wait_us: float
    max_wait_us: float


class Syncs(Shape):
    count: int
    per_step: float
    wait_us: float
    by_call: list[SyncCall]


class Shares(Shape):
    pct: dict[str, float] | None


class Recommendation(Shape):
    finding: Text
    advice: Text


class GateCheck(Shape):
    name: Text
    passed: Text
    message: Text


class Gate(Shape):
    passed: bool
    value: float | None
    minimum: float
    message: Text
    checks: list[GateCheck]


class Memory(Shape):
    steps: list[Object]
    top_allocations: list[Object]
    capture: Object | None
    batch_estimate: Object | None
    device: Text
    note: Text
    source: Text
    peak_phase: Text


class Utilization(Shape):
    gpu_utilization_pct: float | None
    trace: Trace
    steps: Steps
    devices: list[Device]
    syncs: Syncs
    breakdown: Shares | None
    phases: Shares | None
    recommendations: list[Recommendation]
    warnings: list[Text]
    gate: Gate | None
    memory: Memory | None


SHAPES: dict[str, type[Shape]] = {
    "memorization": Memorization,
    "doctor": DoctorReport,
    "utilization": Utilization,
}


def _describe(value: Any) -> str:
    if isinstance(value, bool):
        return "true or false"
    if isinstance(value, str):
        return "text"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return "null" if value is None else "a number"


def problems(kind: str, report: Any, *, limit: int = 5) -> list[str]:
    """Each rendered field of ``report`` (a ``kind`` report) whose type is not dl-ci's."""
    if not isinstance(report, dict):
        return [f"{kind}.json is not an object"]
    # the walk stops at the first problem past the limit: a report the pull request's code
    # wrote can hold millions of wrong items, and the host reads it before the summary
    found = [
        f"{kind}.json: {where} is {_describe(value)}, expected {words}"
        for where, value, words in itertools.islice(
            schema.mismatches(SHAPES[kind], report), limit + 1
        )
    ]
    if len(found) > limit:
        found = [*found[:limit], f"{kind}.json: more fields of wrong types"]
    return found
