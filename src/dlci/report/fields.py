"""The shapes of the gate reports the host renders, declared once and checked before anything
renders them.

A gate's report is written by code the pull request controls, so any field can hold any JSON
value: a string ``threshold`` crashed the job summary (``Unknown format code 'g'``), a list
where a dict was expected would crash a renderer the same way (issue 35). The host checks
every field it renders against the type dl-ci writes there (each report's shape below, on
dlci.schema); a report with a wrong one is a problem named in the summary (the report is not
shown), never a crash. A missing field is not checked here: the renderers show such a report
as incomplete, and fields no renderer reads are not declared. The doctor's, the memorization
and the utilization report are declared whole: their classes are also what their writers build
and their readers read (report/doctor.py, report/memorization.py, profiling/metrics.py,
report/utilization.py).

>>> problems("memorization", {"threshold": "1.0", "tier": {"max_epochs": 3}})
['memorization.json: threshold is text, expected a number or null']
>>> problems("doctor", {"checks": [{"id": "lr", "status": {"x": 1}}]})
['doctor.json: checks[0].status is an object, expected text']
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Annotated, Any, Literal, TypeVar

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
# The utilization report is typed end to end too: profiling/metrics.py builds these classes,
# analysis.py writes them as utilization.json, and every reader reads one back through
# report/utilization.py's read. The fields a report from an older dl-ci lacks have defaults;
# a key written only where it applies (steps.refused, processes, gate, trace_file, a gate's
# judged or applicable) is UNSET, which msgspec leaves out of the JSON. Open tables stay
# mappings: the breakdown and phases (their keys are the split's parts), the launch
# statistics, and the memory pass's figures (capture, batch_estimate, per-step peaks).


class ReadCounts(Shape):
    """trace.read: the trace's events by fate (docs/profiling.md)."""

    events: int = 0
    used: int = 0
    skipped: int = 0
    dropped: int = 0
    dropped_by_reason: dict[str, int] = {}
    outside_steps: int = 0
    host_launches: int = 0
    host_copies: int = 0


class Trace(Shape):
    """What the trace holds; ``state`` and ``read`` are missing from older reports."""

    path: str = ""
    size_bytes: int = 0
    compressed: bool = False
    events: int = 0
    categories: dict[str, int] = {}
    state: str | UnsetType = UNSET
    cpu_only: bool = False
    understood: bool = True
    device_names: dict[str, str] = {}
    torch_version: str | None = None
    window_us: float = 0.0
    read: ReadCounts | UnsetType = UNSET


class Steps(Shape):
    count: int = 0
    numbers: list[int] = []
    mean_step_us: float = 0.0
    refused: str | UnsetType = UNSET  # why the trace's step markers were set aside


class GpuUtilization(Shape):
    definition: str = "tensorboard"
    kernel_us: float = 0.0
    window_us: float = 0.0


class Busy(Shape):
    definition: str = "tracelens"
    busy_us: float = 0.0
    span_us: float = 0.0
    busy_pct: float | None = None


class Temporal(Shape):
    definition: str = "hta"
    last_step_dropped: bool = False
    rounded_to_whole_us: bool = False
    events: int = 0
    span_us: float = 0.0
    idle_us: float = 0.0
    compute_us: float = 0.0
    non_compute_us: float = 0.0
    idle_pct: float = 0.0
    compute_pct: float = 0.0
    non_compute_pct: float = 0.0


class Kernels(Shape):
    count: int = 0
    time_us: float = 0.0
    communication_count: int = 0
    sync_events: int = 0


class CpuOp(Shape):
    name: str
    overlap_us: float = 0.0


class IdleGap(Shape):
    start_us: float
    duration_us: float
    cause: str
    next_launch_us: float | None = None
    cpu_op: CpuOp | None = None


class CopyStats(Shape):
    count: int = 0
    bytes: int = 0
    time_us: float = 0.0
    bandwidth_gbps: float = 0.0
    exposed_us: float = 0.0


class Copies(Shape):
    h2d_pageable: CopyStats = msgspec.field(default_factory=CopyStats)
    h2d_pinned: CopyStats = msgspec.field(default_factory=CopyStats)
    h2d_other: CopyStats = msgspec.field(default_factory=CopyStats)
    d2h: CopyStats = msgspec.field(default_factory=CopyStats)
    d2d: CopyStats = msgspec.field(default_factory=CopyStats)


class Device(Shape):
    """One GPU's figures (``devices[]`` in docs/profiling.md)."""

    device: int
    name: str | None = None
    gpu_utilization_pct: float | None = None
    gpu_utilization: GpuUtilization = msgspec.field(default_factory=GpuUtilization)
    busy: Busy = msgspec.field(default_factory=Busy)
    temporal_breakdown: Temporal = msgspec.field(default_factory=Temporal)
    kernels: Kernels = msgspec.field(default_factory=Kernels)
    idle_gaps: list[IdleGap] = []
    copies: Copies = msgspec.field(default_factory=Copies)


class StepEntry(Shape):
    """One profiled step: its window, GPU utilization, breakdown and phases (microseconds)."""

    step: int = 0
    start_us: float = 0.0
    duration_us: float = 0.0
    host_duration_us: float = 0.0
    gpu_utilization_pct: float | None = None
    breakdown: dict[str, float] = {}
    phases: dict[str, float] = {}


class SyncCall(Shape):
    call: str
    caller: str
    count: int = 0
    wait_us: float = 0.0
    max_wait_us: float = 0.0


class Syncs(Shape):
    count: int = 0
    wait_us: float = 0.0
    per_step: float = 0.0
    blocking_ops: int = 0
    blocking_ops_per_step: float = 0.0
    by_call: list[SyncCall] = []


class Launches(Shape):
    launch_calls: dict[str, float] = {}  # count, mean_us, median_us, p95_us
    launch_delay: dict[str, float] = {}
    tiny_kernel_threshold_us: float = 0.0
    tiny_kernels: int = 0
    tiny_kernels_pct: float = 0.0
    tiny_kernel_time_pct: float = 0.0
    launch_bound_kernels: int = 0


class Memory(Shape):
    """Section E, from the trace's [memory] events, with dlci profile's own figures."""

    source: str = "none"
    note: str | None = None
    device: str | None = None
    device_total_bytes: int | None = None
    peak_allocated_bytes: int | None = None
    peak_reserved_bytes: int | None = None
    peak_percent_of_device: float | None = None
    peak_phase: str | None = None
    steps: list[Object] = []
    top_allocations: list[Object] = []
    capture: Object | None = None  # the memory pass's per-step figures (memcapture.py)
    batch_estimate: Object | None = None  # batchfit.py
    trace_file: str | UnsetType = UNSET  # the memory pass's trace, when there was one


class Recommendation(Shape):
    id: str = ""
    finding: str = ""
    advice: str = ""


class GateCheck(Shape):
    name: str
    passed: bool
    judged: bool = False
    message: str = ""
    hint: str | None = None


class Gate(Shape, kw_only=True):
    """The verdict of the gates asked for (--min-gpu-util, --max-gpu-memory), decided once
    (profiling/gate.py); ``checks`` lists each (older reports: the utilization gate alone)."""

    minimum: float | None = None
    value: float | None = None
    passed: bool
    judged: bool | UnsetType = UNSET
    applicable: bool | UnsetType = UNSET
    message: str = ""
    hint: str | None = None
    max_gpu_memory: float | UnsetType = UNSET
    gpu_memory_pct: float | UnsetType | None = UNSET
    checks: list[GateCheck] | UnsetType = UNSET


class Process(Shape):
    """One process of a merged multi-process trace, with its own steps and GPUs."""

    pid: int
    rank: int | None = None
    steps: Steps = msgspec.field(default_factory=Steps)
    primary_device: int | None = None
    gpu_utilization_pct: float | None = None
    devices: list[Device] = []
    per_step: list[StepEntry] = []
    breakdown: Object = {}
    phases: Object = {}
    warnings: list[str] = []


class Utilization(Shape):
    """utilization.json. ``breakdown`` and ``phases`` hold ``total_us``, one ``<part>_us`` per
    part and ``pct`` (the parts' shares); empty without steps."""

    schema_version: int = 1
    kind: str = "utilization"
    trace: Trace = msgspec.field(default_factory=Trace)
    steps: Steps = msgspec.field(default_factory=Steps)
    devices: list[Device] = []
    primary_device: int | None = None
    gpu_utilization_pct: float | None = None
    per_step: list[StepEntry] = []
    breakdown: Object = {}
    phases: Object = {}
    syncs: Syncs | None = None  # None: a partial report (every report dl-ci writes has it)
    launches: Launches = msgspec.field(default_factory=Launches)
    memory: Memory | None = None  # None: a report from before the memory section
    warnings: list[str] = []
    recommendations: list[Recommendation] = []
    processes: list[Process] | UnsetType = UNSET  # a merged multi-process trace only
    gate: Gate | UnsetType = UNSET  # only when a gate was asked for

    def shares(self, part: str) -> dict[str, float]:
        """The ``pct`` of ``breakdown`` or ``phases``: part -> share of the total (%), the
        entries that are percentages only (an open table: a report may hold anything)."""
        found = (self.breakdown if part == "breakdown" else self.phases).get("pct")
        return {
            str(k): float(v)
            for k, v in (found.items() if isinstance(found, dict) else ())
            if isinstance(v, int | float) and not isinstance(v, bool) and -1e6 < v < 1e6
        }


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


# Values (list items and object members, at any depth) a report may hold: dl-ci's hold far
# fewer (a curve of 100,000 losses is one list), and the walk below costs a microsecond each:
# 21 million empty steps in 63 MB of run.json took a minute and 4 GB before this bound.
MAX_VALUES = 2_000_000
# and the job's own records, far smaller: a run.json holds a few steps of 40 log lines each
LIMITS = {"run": 100_000, "host-record": 200_000, "cleanup": 100_000}


def problems(kind: str, report: Any, *, limit: int = 5) -> list[str]:
    """Each rendered field of ``report`` (a ``kind`` report) whose type is not dl-ci's.

    >>> problems("memorization", {"losses": [0.0] * (MAX_VALUES + 1)})
    ['memorization.json holds more than 2,000,000 values: not a report dl-ci writes']
    >>> problems("run", {"steps": [{}] * 100_001})
    ['run.json holds more than 100,000 values: not a report dl-ci writes']
    """
    if not isinstance(report, dict):
        return [f"{kind}.json is not an object"]
    most = LIMITS.get(kind, MAX_VALUES)
    if _values_over(report, most):
        return [f"{kind}.json holds more than {most:,} values: not a report dl-ci writes"]
    try:  # the common case, in msgspec's own time: every field of the declared types
        msgspec.convert(report, SHAPES[kind])
    except msgspec.ValidationError:
        pass  # a field of a wrong type, a missing one, or a value out of range: the walk says
    else:
        return []
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


def _values_over(report: Any, budget: int) -> bool:
    """Whether ``report`` holds more than ``budget`` values, counted without recursion and
    given up as soon as it does."""
    stack, seen = [report], 0
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        seen += len(children)
        if seen > budget:
            return True
        stack.extend(children)
    return False


# --------------------------------------------------------------------------- run.json
# The job's run record is typed end to end: dlci run in a container (action/job/run.py) builds
# a RunRecord and rewrites run.json after every step; the host (action/host/gates.py) reads
# each container's run.json back with read_run (the container ran the pull request's code: its
# record is a claim, every wrong-typed field named, never a traceback), builds its own
# RunRecord from those claims and each gate's step, and writes it into its reports folder and
# its record (HostRecord, the DLCI_HOST_RECORD file); the job summary and the HTML page read
# both back the same way, and cleanup.json (Cleanup) too. A key written only where it applies
# (a step's command, exit code, log tail or reason; the host's timing) is UNSET, which msgspec
# leaves out of the JSON. The torch record stays a mapping: the image's own file, shown as a
# claim. preflight.json stays a mapping: dlci.trust.host reads its configuration.


class RunStep(Shape):
    """One step of the job, as dlci run records it (its status from the exit code, then its
    report: dlci.action.host.verdicts.judge), with the host's additions on the host's copy."""

    name: str = ""
    command: str | UnsetType = UNSET  # a step that ran
    status: str = ""  # passed, failed, error, interrupted, skipped; running while it runs
    exit_code: int | UnsetType = UNSET
    reason: str | UnsetType = UNSET  # why it did not pass, or was skipped
    duration_s: float | UnsetType = UNSET  # seconds; absent while the step runs
    log_tail: list[str] | UnsetType = UNSET  # its last lines of output
    killed: str | UnsetType = UNSET  # "oom-or-kill": SIGKILL
    test: str | UnsetType = UNSET  # the test running when the tests step was killed
    container_exit_code: int | UnsetType | None = UNSET  # the host's: the part's container
    isolated: bool | UnsetType = UNSET  # the host's: a gate run in a container of its own

    def apply(self, changes: Mapping[str, object]) -> None:
        """A verdict's changes to the step (classify's, judge's: its status, a reason)."""
        for key, value in changes.items():
            setattr(self, key, value)


class Threads(Shape):
    """The CPU threads dlci run set for every step, and why (action/job/threads.py)."""

    value: int | str | None = None
    source: str = ""


class KitTime(Shape):
    """The kit's own seconds: the host's copies of the checkout, each container's start and
    stop beyond its steps, the install image's commit."""

    copies_s: float = 0.0
    containers_s: float = 0.0
    commit_s: float = 0.0


class Timing(Shape):
    """Where the job's container time went (action/host/gates.where_the_time_went)."""

    project_s: float = 0.0
    project: dict[str, float] = {}  # step -> its seconds (the containers' claims)
    kit_s: float = 0.0
    kit: KitTime = msgspec.field(default_factory=KitTime)
    parts: dict[str, dict[str, float]] = {}  # part -> copy_s, container_s, commit_s


class RunRecord(Shape):
    """run.json: the job's steps and its verdict; in a container ``running`` or ``failing``
    until the last step ends, then ``pass`` or ``fail``. ``timing`` and ``isolated_gates``
    are the host's own, on the record it writes."""

    schema_version: int = 1
    kind: str = "run"
    timing: Timing | UnsetType = UNSET
    started: str = ""
    cwd: str = ""
    steps: list[RunStep] = []
    failed_steps: list[str] = []
    verdict: str = ""
    isolated_gates: list[str] | UnsetType = UNSET
    torch: Object | None = None  # the image's record of its torch (a claim, shown as such)
    threads: Threads | None = None

    def step(self, name: str) -> RunStep | None:
        """The first step called ``name``; None when there is none."""
        return next((s for s in self.steps if s.name == name), None)


class ReportCopy(Shape):
    """A gate report the host copied out of the gate's own directory."""

    part: str = ""
    sha256: str = ""


class HostRecord(Shape):
    """The host's record of the container run (DLCI_HOST_RECORD, outside the workspace)."""

    schema_version: int = 1
    kind: str = "host-record"
    tier: Object | None = None  # the job plan's tier, read before any container
    preflight: Object | None = None  # the job plan, as dlci.trust.host reads it
    exit_codes: dict[str, int] = {}
    isolated_parts: list[str] = []
    reports: dict[str, ReportCopy] = {}
    reports_dir: str = ""
    refused: list[str] = []
    planted: list[str] = []
    problems: list[str] = []
    run: RunRecord | None = None


class GpuProcess(Shape):
    """A compute process nvidia-smi lists after the job, or why it could not list them."""

    pid: int | UnsetType = UNSET
    used_memory_mib: int | UnsetType = UNSET
    gpu_uuid: str | UnsetType = UNSET
    error: str | UnsetType = UNSET


class Cleanup(Shape):
    """cleanup.json: what the host undid after the job (action/host/cleanup.py)."""

    schema_version: int = 1
    kind: str = "cleanup"
    job: str = ""
    containers_removed: int = 0
    images_removed: int = 0
    foreign_files: int = 0
    ownership_restored: int = 0
    ownership_method: str = ""
    foreign_left: int = 0
    foreign_sample: list[str] = []
    gpu_processes: list[GpuProcess] = []


class PreflightError(Shape):
    message: str = ""
    hint: str | None = None


class Preflight(Shape):
    """What the job summary reads of preflight.json (dlci preflight's, on the host), checked
    before it reads it: the report stays a mapping, whose configuration dlci.trust.host reads
    and the baseline keeps (its other sections: fork_guard, config, ladder, docker)."""

    passed: bool = False
    gpu: bool = False
    tier: Object | None = None
    error: PreflightError | None = None


SHAPES.update(
    {"run": RunRecord, "host-record": HostRecord, "cleanup": Cleanup, "preflight": Preflight}
)
R = TypeVar("R", bound=msgspec.Struct)


def read_as(kind: str, cls: type[R], raw: Any) -> R:
    """``raw`` (a decoded ``kind`` report) as ``cls``: the one way every report is read back.

    ValueError naming each field of a wrong type (:func:`problems`); else, for a report whose
    types are right, the first required field it lacks (it "is incomplete") or a value no
    field holds, such as an integer beyond 64 bits (it "cannot be read"). msgspec reads a
    sound report in one pass; only a report it refuses is walked for the names.
    """
    if not isinstance(raw, dict) or _values_over(raw, LIMITS.get(kind, MAX_VALUES)):
        raise ValueError("; ".join(problems(kind, raw)))
    try:
        return msgspec.convert(raw, cls)
    except msgspec.ValidationError as exc:
        error = exc
    wrong = problems(kind, raw)
    if wrong:
        raise ValueError("; ".join(wrong))
    how = "is incomplete" if "missing required field" in str(error) else "cannot be read"
    raise ValueError(f"{kind}.json {how}: {error}")


def read_run(raw: Any) -> RunRecord:
    """A decoded run.json as its classes; ValueError naming each field of a wrong type, or a
    value no field holds (a duration beyond any float).

    >>> read_run({"steps": [{"name": "tests", "status": "passed", "duration_s": 2}]}).steps[0]
    RunStep(name='tests', command=UNSET, status='passed', exit_code=UNSET, reason=UNSET, \
duration_s=2.0, log_tail=UNSET, killed=UNSET, test=UNSET, container_exit_code=UNSET, isolated=UNSET)
    >>> read_run({"steps": [{"name": "tests", "status": 0}]})
    Traceback (most recent call last):
    ValueError: run.json: steps[0].status is a number, expected text
    >>> read_run({"steps": [{"name": "tests", "duration_s": 10**400}]})
    Traceback (most recent call last):
    ValueError: run.json cannot be read: Number out of range - at `$.steps[0].duration_s`
    """
    return read_as("run", RunRecord, raw)


def read_host_record(raw: Any) -> HostRecord:
    """A decoded host record as its classes; ValueError as :func:`read_run`."""
    return read_as("host-record", HostRecord, raw)


def read_cleanup(raw: Any) -> Cleanup:
    """A decoded cleanup.json as its classes; ValueError as :func:`read_run`."""
    return read_as("cleanup", Cleanup, raw)


# ---- comparison/history
# history.json (dlci history) is typed end to end: report/history.py builds and reads these
# classes, action/github/history.py appends tonight's entry and writes them. A history comes
# from an artifact, so it is read entry by entry (report/history.checked): an entry with a field
# of a wrong type is left out, named; every field of an entry is written, null when unknown.
# baseline-source.json (which run a fetched baseline came from) is read the same way.


class HistoryEntry(Shape, kw_only=True):
    """One night of one hardware class: its figures, and the tier it was judged at (a changed
    ladder is another tier, not drift)."""

    date: str | None = None
    run_id: str | None = None
    sha: str | None = None
    hardware_class: str
    torch: str | None = None
    gpu_utilization_pct: float | None = None
    step_time_us: float | None = None
    epochs_to_threshold: int | None = None
    final_loss: float | None = None
    coverage_pct: float | None = None
    budget: str | None = None
    ladder_revision: str | None = None
    threshold_form: str | None = None
    threshold: float | None = None
    relative_threshold: float | None = None
    max_epochs: int | None = None


class History(Shape):
    """history.json: at most report/history.MAX_ENTRIES entries, oldest first."""

    schema_version: int = 1
    kind: str = "history"
    entries: list[HistoryEntry] = []


# A word of baseline-source.json: the file sits in an artifact, and its words reach the
# summary, the comment and the baseline-run output (a 20 MiB id went there whole).
Word = Annotated[str, msgspec.Meta(max_length=1000)]


class BaselineSource(Shape):
    """Where a baseline's reports came from: a folder, or a run and its artifact (the run's
    fields as GitHub's API names them); each key only when known, each word 1,000 characters
    at most (a longer one: the file cannot be read, and the baseline is shown as its folder)."""

    folder: Word | UnsetType = UNSET
    id: Annotated[int, msgspec.Meta(ge=0, le=2**53)] | Word | UnsetType | None = UNSET
    head_sha: Word | UnsetType | None = UNSET
    head_branch: Word | UnsetType | None = UNSET
    created_at: Word | UnsetType | None = UNSET
    html_url: Word | UnsetType | None = UNSET
    artifact: Word | UnsetType = UNSET
    skipped: Annotated[list[Word], msgspec.Meta(max_length=100)] | UnsetType = UNSET
    passed_over: Annotated[list[int], msgspec.Meta(max_length=100)] | UnsetType = UNSET


SHAPES["history"] = History
SHAPES["baseline-source"] = BaselineSource
