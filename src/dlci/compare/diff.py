"""Two utilization reports compared with statistics: the result's JSON (schema_version 2).

GPU utilization and step time are judged on every profiled step of both runs (the profiler's
warm-up steps are never recorded): the change is the Hodges-Lehmann shift with its 95%
interval (:mod:`dlci.compare.stats`), in percentage points for utilization and in percent of
BASE's for step time. A figure regresses only when its whole interval is beyond the bound;
too few steps, too much spread or unequally scattered runs say ``inconclusive``. Runs on
different GPUs, hardware classes or torch versions are ``not comparable``, and so is the
GPU utilization of a CPU-only trace. Data loading share and syncs per step are shown, not
gated. The console and Markdown renderings are in :mod:`dlci.report.diff_render`.

The reports compared are :class:`~dlci.report.fields.Utilization` (:class:`Report` names what
is read of one: the report's classes are a room above this one): a report read from a file
(another run's, a baseline's) is checked first (:func:`check_report`: the ranges of the figures
compared, then every field's type, with the checker the caller gives), then read into its
classes (:func:`dlci.report.utilization.read`).

The result is typed too (:class:`Diff`, its rows :class:`PlainRow` and :class:`JudgedRow`):
:func:`compare` builds it, the renderers (dlci.report.diff_render, dlci.report.comparison) read
its attributes, and msgspec writes it as the JSON above. A key that is absent unless it applies
(a judged row's interval, when the runs are not comparable) is UNSET, which msgspec leaves out.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import msgspec
from msgspec import UNSET, UnsetType

from dlci.compare import stats
from dlci.jsonio import describe

SCHEMA_VERSION = 2
KIND = "utilization-diff"
DEFAULT_BOUND = 5.0  # points of utilization, percent of step time
VERDICTS_JUDGED = ("ok", "regressed", "likely regressed", "inconclusive")
METHOD = "Hodges-Lehmann shift, 95% Mann-Whitney (Moses) interval, per profiled step"
MAX_STEPS = 100_000  # per_step entries a report may hold
GPU = "gpu_utilization_pct"
# Why a CPU-only trace's step time is shown, not gated: the steps time the host's CPU, which
# other jobs share, and their load moves a whole run at once, which no run's own steps show
# (docs/comparison.md: two 5-step runs of unchanged code here differed by +12% to +54%).
CPU_STEPS = "its steps time the shared host CPU, whose load moves a whole run; shown, not gated"


class _Step(Protocol):
    @property
    def duration_us(self) -> float: ...
    @property
    def gpu_utilization_pct(self) -> float | None: ...


class _Steps(Protocol):
    @property
    def mean_step_us(self) -> float: ...


class _Syncs(Protocol):
    @property
    def per_step(self) -> float: ...


class _Device(Protocol):
    @property
    def device(self) -> int: ...
    @property
    def name(self) -> str | None: ...


class _Trace(Protocol):
    @property
    def device_names(self) -> Mapping[str, str]: ...
    @property
    def torch_version(self) -> str | None: ...


class Report(Protocol):
    """What the comparison reads of a utilization report (dlci.report.fields.Utilization)."""

    @property
    def gpu_utilization_pct(self) -> float | None: ...
    @property
    def per_step(self) -> Sequence[_Step]: ...
    @property
    def steps(self) -> _Steps: ...
    @property
    def syncs(self) -> _Syncs | None: ...
    @property
    def devices(self) -> Sequence[_Device]: ...
    @property
    def primary_device(self) -> int | None: ...
    @property
    def trace(self) -> _Trace: ...
    def shares(self, part: str) -> dict[str, float]: ...


class Environment(msgspec.Struct, kw_only=True):
    """What a run ran on, as far as its report and its job say (None: unknown)."""

    gpu: str | None = None
    cpu_only: bool = False
    torch: str | None = None
    hardware_class: str | None = None


class PlainRow(msgspec.Struct, kw_only=True):
    """A figure shown side by side, not gated: its plain difference."""

    metric: str
    base: float | None
    head: float | None
    unit: str
    change: float | None
    verdict: str = "not gated"
    reason: str = ""
    regressed: bool = False

    def interval(self) -> tuple[float, float] | None:
        return None


class JudgedRow(msgspec.Struct, kw_only=True):
    """A gated figure: its verdict from the per-step samples of both runs (the statistics are
    UNSET when the runs are not comparable: nothing was judged)."""

    metric: str
    base: float | None
    head: float | None
    unit: str
    verdict: str
    estimate: float | UnsetType | None = UNSET
    low: float | UnsetType | None = UNSET
    high: float | UnsetType | None = UNSET
    n_base: int | UnsetType = UNSET
    n_head: int | UnsetType = UNSET
    spread_base: float | UnsetType | None = UNSET
    spread_head: float | UnsetType | None = UNSET
    reason: str = ""
    change: float | UnsetType | None = UNSET
    regressed: bool = False

    def interval(self) -> tuple[float, float] | None:
        """The 95% interval of the change, when there is one."""
        low, high = self.low, self.high
        if isinstance(low, float | int) and isinstance(high, float | int):
            return float(low), float(high)
        return None


Row = PlainRow | JudgedRow


def change_of(row: Row) -> float | None:
    """A row's change (None: none, or nothing judged)."""
    return None if isinstance(row.change, UnsetType) else row.change


class Bounds(msgspec.Struct, kw_only=True):
    utilization_drop_pt: float | None
    step_time_regression_pct: float | None


class Environments(msgspec.Struct, kw_only=True):
    base: Environment
    head: Environment


class Diff(msgspec.Struct, kw_only=True):
    """The comparison of two utilization reports (schema_version 2, kind utilization-diff).

    Written (``--json``, ``dlci baseline --json``), never read back: its rows are of two
    classes, told apart by the fields they hold, which msgspec writes but cannot decode."""

    schema_version: int = SCHEMA_VERSION
    kind: str = KIND
    method: str = METHOD
    bounds: Bounds
    environment: Environments
    not_comparable: list[str] = []
    compared: int = 0
    verdict: str
    passed: bool
    rows: list[Row] = []
    regressions: list[Row] = []
    likely_regressed: list[str] = []  # warned, or failed with block_likely (then regressions)
    inconclusive: list[str] = []
    block_likely_regressions: bool = False


@dataclass(frozen=True)
class Metric:
    """One compared figure: where it is in a report, and how it is judged and shown."""

    key: str
    title: str
    unit: str  # the JSON's word for the change: "percentage points", "percent"
    value: Callable[[Report], float | None]  # the figure shown for one report
    per_step: str | None  # the per_step key of its samples; None: not gated, shown only
    show: Callable[[float], str]


def _float(value: float | None) -> float | None:
    return None if value is None else float(value)


def step_values(report: Report, key: str) -> list[float]:
    """One per-step figure of every profiled step (``duration_us`` or
    ``gpu_utilization_pct``; nulls left out)."""
    values = (getattr(step, key) for step in report.per_step)
    return [float(value) for value in values if value is not None]


def median_step_us(report: Report) -> float | None:
    """The median step time, else the mean of a report without per-step times (0: none)."""
    values = sorted(step_values(report, "duration_us"))
    if values:
        mid = len(values) // 2
        return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2
    return float(report.steps.mean_step_us) or None


METRICS = (
    Metric(
        "gpu_utilization_pct",
        "GPU utilization",
        "percentage points",
        lambda r: _float(r.gpu_utilization_pct),
        "gpu_utilization_pct",
        lambda v: f"{v:.1f} %",
    ),
    Metric(
        "step_time_us",
        "step time (median)",
        "percent",
        median_step_us,
        "duration_us",
        lambda v: f"{v / 1e3:.2f} ms",
    ),
    Metric(
        "data_loading_pct",
        "data loading share",
        "percentage points",
        lambda r: _float(r.shares("phases").get("data_loading")),
        None,
        lambda v: f"{v:.1f} %",
    ),
    Metric(
        "syncs_per_step",
        "blocking syncs per step",
        "per step",
        lambda r: None if r.syncs is None else float(r.syncs.per_step),
        None,
        lambda v: f"{v:g}",
    ),
)
BY_KEY = {metric.key: metric for metric in METRICS}
# the fields compare reads, with the range a report dl-ci wrote keeps them in
FIELDS = (
    (("gpu_utilization_pct",), 0.0, 100.0),
    (("steps", "mean_step_us"), 0.0, 1e18),
    (("phases", "pct", "data_loading"), 0.0, 100.0),
    (("syncs", "per_step"), 0.0, 1e18),
)
STEP_FIELDS = (("duration_us", 0.0, 1e18), ("gpu_utilization_pct", 0.0, 100.0))


def _check_number(value: Any, where: str, low: float, high: float) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return f"{where}: expected a number, got {describe(value)}"
    if not low <= value <= high:  # NaN too
        return f"{where}: expected a number from {low:g} to {high:g}, got {describe(value)}"
    return None


def check_report(
    report: dict[str, Any], types: Callable[[dict[str, Any]], list[str]] | None = None
) -> str | None:
    """What is wrong with a field :func:`compare` reads, or None; a missing field or null is
    fine (the figure is left out). ``types``: the report's type check (a list of problems,
    as dlci.report.fields.problems gives them), run when the figures are sound.

    >>> check_report({"steps": {"mean_step_us": "x"}})
    "steps.mean_step_us: expected a number, got 'x'"
    >>> check_report({"phases": []})
    'phases: expected an object, got a list'
    >>> check_report({"gpu_utilization_pct": 250})
    'gpu_utilization_pct: expected a number from 0 to 100, got 250'
    >>> check_report({"per_step": [{"duration_us": -1}]})
    'per_step[0].duration_us: expected a number from 0 to 1e+18, got -1'
    >>> check_report({"warnings": "x"}, lambda report: ["utilization.json: warnings is text"])
    'warnings is text'
    """
    for path, low, high in FIELDS:
        node: Any = report
        for depth, key in enumerate(path):
            if not isinstance(node, dict):
                return f"{'.'.join(path[:depth])}: expected an object, got {describe(node)}"
            node = node.get(key)
            if node is None:
                break
        else:
            problem = _check_number(node, ".".join(path), low, high)
            if problem:
                return problem
    problem = _check_steps(report.get("per_step"))
    wrong = types(report) if problem is None and types is not None else []
    return wrong[0].removeprefix("utilization.json: ") if wrong else problem


def _check_steps(steps: Any) -> str | None:
    if steps is None:
        return None
    if not isinstance(steps, list):
        return f"per_step: expected a list, got {describe(steps)}"
    if len(steps) > MAX_STEPS:
        return f"per_step: more than {MAX_STEPS} steps ({len(steps)})"
    for i, step in enumerate(steps):
        if not isinstance(step, dict):
            return f"per_step[{i}]: expected an object, got {describe(step)}"
        for key, low, high in STEP_FIELDS:
            if step.get(key) is not None:
                problem = _check_number(step[key], f"per_step[{i}].{key}", low, high)
                if problem:
                    return problem
    return None


def environment(report: Report, known: Environment | None = None) -> Environment:
    """What a run ran on, as far as its report (and ``known``: the job's hardware class and
    torch version, when known; its None fields are unknown) says: GPU name, CPU-only, torch,
    hardware class."""
    gpu = None
    for device in report.devices:
        if device.device == report.primary_device:
            gpu = device.name
    names = report.trace.device_names
    if gpu is None and names:
        gpu = next(iter(names.values()))
    env = Environment(
        gpu=gpu, cpu_only=report.gpu_utilization_pct is None, torch=report.trace.torch_version
    )
    if known is not None:
        env.gpu = env.gpu if known.gpu is None else known.gpu
        env.torch = env.torch if known.torch is None else known.torch
        env.hardware_class = known.hardware_class
    return env


def not_comparable(base: Environment, head: Environment) -> list[str]:
    """Why two runs' timings cannot be compared: other hardware, another torch.

    >>> not_comparable(Environment(torch="2.4.0", gpu="A100"),
    ...                Environment(torch="2.5.1", gpu="A100"))
    ['torch 2.4.0 (base) and 2.5.1 (head)']
    """
    found = []
    for what, b, h in (
        ("hardware class", base.hardware_class, head.hardware_class),
        ("GPU", base.gpu, head.gpu),
        ("torch", base.torch, head.torch),
    ):
        if b is not None and h is not None and str(b) != str(h):
            found.append(f"{what} {str(b)[:80]} (base) and {str(h)[:80]} (head)")
    return found


def _plain_row(metric: Metric, b: float, h: float) -> PlainRow:
    """A figure shown side by side, not gated: its plain difference."""
    change = h - b if metric.unit != "percent" else 100.0 * (h - b) / b
    return PlainRow(metric=metric.key, base=b, head=h, unit=metric.unit, change=round(change, 4))


def _judged_row(
    metric: Metric,
    base: Report,
    head: Report,
    bound: float | None,
    blocked: list[str],
) -> JudgedRow:
    """A gated figure: its verdict from the per-step samples of both runs."""
    row = JudgedRow(
        metric=metric.key,
        base=metric.value(base),
        head=metric.value(head),
        unit=metric.unit,
        verdict="not comparable",
    )
    cpu = [n for n, r in (("base", base), ("head", head)) if r.gpu_utilization_pct is None]
    which = "both" if len(cpu) == 2 else cpu[0] if cpu else ""
    if metric.key == GPU and cpu:
        row.reason = f"CPU-only trace ({which}): no GPU utilization to compare"
        return row
    if blocked:
        row.reason = "; ".join(blocked)
        return row
    assert metric.per_step is not None
    log = metric.unit == "percent"
    judged = stats.judge(
        step_values(base, metric.per_step),
        step_values(head, metric.per_step),
        bound=None if cpu else bound,
        log=log,
        worse=1 if log else -1,
        floor=2.0,
    )
    row.verdict, row.reason = judged.verdict, judged.reason
    row.estimate, row.low, row.high = judged.estimate, judged.low, judged.high
    row.n_base, row.n_head = judged.n_base, judged.n_head
    row.spread_base, row.spread_head = judged.spread_base, judged.spread_head
    row.change = None if judged.estimate is None else round(judged.estimate, 4)
    if cpu:  # measured, never gated: see CPU_STEPS
        row.verdict, row.reason = "not comparable", f"CPU-only trace ({which}): {CPU_STEPS}"
    return row


def compare(
    base: Report,
    head: Report,
    bound: float | None = DEFAULT_BOUND,
    *,
    max_utilization_drop: float | None = None,
    max_step_time_regression: float | None = None,
    base_env: Environment | None = None,
    head_env: Environment | None = None,
    block_likely: bool = False,
) -> Diff:
    """What got worse from BASE to HEAD, judged on every profiled step of both.

    ``block_likely``: a ``likely regressed`` figure fails too (else it is a warning).
    ``base_env``, ``head_env``: what each job knows of its run (:func:`environment`).

    ``bound`` is both bounds (points of utilization, percent of step time) unless one is
    given alone; a bound of None shows the figure with its interval, without a verdict.

    >>> from dlci.report.fields import StepEntry, Utilization
    >>> steps = lambda u, ms: [StepEntry(step=i, duration_us=ms * (1000 + i),
    ...                                  gpu_utilization_pct=u + i / 10) for i in range(10)]
    >>> base = Utilization(gpu_utilization_pct=80.0, per_step=steps(80.0, 1.0))
    >>> head = Utilization(gpu_utilization_pct=60.0, per_step=steps(60.0, 1.02))
    >>> result = compare(base, head)
    >>> result.verdict, [r.metric for r in result.regressions]
    ('failed', ['gpu_utilization_pct'])
    """
    bounds = {
        "gpu_utilization_pct": bound if max_utilization_drop is None else max_utilization_drop,
        "step_time_us": bound if max_step_time_regression is None else max_step_time_regression,
    }
    benv, henv = environment(base, base_env), environment(head, head_env)
    blocked = not_comparable(benv, henv)
    rows: list[Row] = []
    for metric in METRICS:
        b, h = metric.value(base), metric.value(head)
        row: Row
        if (metric.per_step is not None and (b, h) != (None, None)) or metric.key == GPU:
            row = _judged_row(metric, base, head, bounds[metric.key], blocked)
        elif b is not None and h is not None and (metric.unit != "percent" or b > 0):
            row = _plain_row(metric, b, h)
        else:
            continue
        row.regressed = row.verdict == "regressed" or (
            block_likely and row.verdict == "likely regressed"
        )
        rows.append(row)
    result = _result(rows, bounds, blocked, Environments(base=benv, head=henv))
    result.block_likely_regressions = block_likely
    return result


def _result(
    rows: list[Row],
    bounds: dict[str, float | None],
    blocked: list[str],
    environments: Environments,
) -> Diff:
    regressions = [row for row in rows if row.regressed]
    inconclusive = [row.metric for row in rows if row.verdict == "inconclusive"]
    likely = [row.metric for row in rows if row.verdict == "likely regressed"]
    judged = [row for row in rows if row.verdict in VERDICTS_JUDGED]
    verdict = (
        "failed" if regressions else "likely regressed" if likely
        else "inconclusive" if inconclusive else "passed"
    )  # fmt: skip
    if not judged and any(row.verdict == "not comparable" for row in rows):
        verdict = "not comparable"
    return Diff(
        bounds=Bounds(
            utilization_drop_pt=bounds["gpu_utilization_pct"],
            step_time_regression_pct=bounds["step_time_us"],
        ),
        environment=environments,
        not_comparable=blocked,
        compared=sum(
            BY_KEY[row.metric].per_step is not None and None not in (row.base, row.head)
            for row in rows
        ),
        verdict=verdict,
        passed=not regressions,
        rows=rows,
        regressions=regressions,
        likely_regressed=likely,
        inconclusive=inconclusive,
    )
