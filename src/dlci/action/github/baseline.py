"""This run against its baseline: memorization, utilization and coverage side by side.

Host-side (no torch). HEAD is this job's reports as the summary step verified them (the
host's copy, checked again against the host's record: a report the record does not vouch
for is left out); BASE is another run's reports (:mod:`dlci.action.github.artifacts`, or a folder).
Both are outside input, read under caps and checked field by field
(:mod:`dlci.action.github.sides`). Utilization is judged with statistics
(:mod:`dlci.compare.diff`): a bound fails the job only when it is exceeded with confidence;
memorization and coverage are shown, not gated.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from dlci import jsonio
from dlci.action.github.api import ApiError, GitHub
from dlci.action.github.artifacts import JOB_ID, fetch
from dlci.action.github.comment import sticky_comment
from dlci.action.github.sides import (
    Side,
    base_side,
    checked_memorization,
    checked_utilization,
    hardware_class,
    number,
    read_json,
)
from dlci.action.github.sizing import SOURCE_FILE
from dlci.action.host.summary import collect
from dlci.compare import diff
from dlci.errors import DlciError
from dlci.report.comparison import (
    MARKER,
    Comparison,
    Curves,
    LeftOut,
    SideRow,
    read_source,
    render,
    render_none,
)
from dlci.report.fields import BaselineSource, Memorization
from dlci.report.github import in_github_actions
from dlci.trust import host as trusted


def head_side(folder: Path, host_record: Path | None) -> Side:
    """This run's reports as the summary step verified them (the host's record), checked."""
    data = collect(folder, host_record)
    side = Side(coverage=data.coverage)
    if data.utilization is not None:
        side.utilization = checked_utilization(folder / "utilization.json", side)
    if data.memorization is not None:
        side.memorization = checked_memorization(folder / "memorization.json", side)
    side.hardware_class = hardware_class(data.preflight, side.memorization)
    side.preflight = data.preflight
    return side


def bound(given: float | None, head: Side, key: str) -> float | None:
    """A comparison bound: the one given (the action's input, the command line), else the
    trusted configuration's (the host record's preflight, never the workspace's files)."""
    return given if given is not None else trusted.number(head.preflight, key)


def memorization_rows(base: Side, head: Side) -> list[SideRow]:
    """Epochs to the threshold and the final loss, side by side (not gated)."""
    rows: list[SideRow] = []
    b, h = base.memorization, head.memorization
    if b is None and h is None:
        return rows

    def epochs(report: Memorization | None) -> int | None:
        return report.steps if report is not None and report.verdict == "pass" else None

    def final(report: Memorization | None) -> float | None:
        return number(report.final_loss) if report is not None else None

    rows.append(_plain("epochs_to_threshold", epochs(b), epochs(h), "count"))
    rows.append(_plain("final_loss", final(b), final(h), "loss"))
    tb, th = (_criterion(b), _criterion(h)) if b is not None and h is not None else ("", "")
    if tb != th:  # another tier: other epochs to reach it
        for row in rows:
            row.verdict = "not comparable"
            row.reason = f"memorised means {tb} (base) and {th} (head): another tier"
    return rows


def _criterion(report: Memorization) -> str:
    """What a report's run had to reach: thresholds and the ladder revision, as text.

    >>> from dlci.report.memorization import read
    >>> _criterion(read({"threshold": 1.0, "tier": {"ladder_revision": "2026.11"}}))
    'loss < 1, ladder 2026.11'
    >>> _criterion(read({"threshold": None, "relative_threshold": 0.3}))
    'a share of the start of 0.3'
    """
    parts = []
    absolute, relative = number(report.threshold), number(report.relative_threshold)
    if absolute is not None:
        parts.append(f"loss < {absolute:g}")
    if relative is not None:
        parts.append(f"a share of the start of {relative:g}")
    revision = report.tier.ladder_revision
    if revision:
        parts.append(f"ladder {revision[:40]}")
    return ", ".join(parts) or "no threshold recorded"


def _plain(metric: str, b: float | None, h: float | None, unit: str) -> SideRow:
    change = None if b is None or h is None else h - b
    return SideRow(metric=metric, base=b, head=h, change=change, unit=unit)


def compare_sides(
    base: Side,
    head: Side,
    *,
    max_utilization_drop: float | None,
    max_step_time: float | None,
    block_likely: bool = False,
) -> Comparison:
    """The side-by-side result: rows by section, the utilization diff, the verdict."""
    utilization = None
    if base.utilization is not None and head.utilization is not None:
        utilization = diff.compare(
            base.utilization,
            head.utilization,
            None,
            max_utilization_drop=max_utilization_drop,
            max_step_time_regression=max_step_time,
            base_env=base.environment(),
            head_env=head.environment(),
            block_likely=block_likely,
        )
    coverage = []
    if base.coverage is not None or head.coverage is not None:
        coverage.append(_plain("coverage", base.coverage, head.coverage, "percentage points"))
    verdict = "passed" if utilization is None else utilization.verdict
    warnings = []
    if utilization is None and (max_utilization_drop, max_step_time) != (None, None):
        # a bound was asked for and nothing was judged: never read as passed
        verdict = "inconclusive"
        missing = [
            name for name, side in (("base", base), ("head", head)) if side.utilization is None
        ]
        warnings.append(
            f"nothing was gated: the {' and the '.join(missing)} "
            f"{'has' if len(missing) == 1 else 'have'} no utilization report to compare"
        )
    return Comparison(
        memorization=memorization_rows(base, head),
        utilization=utilization,
        coverage=coverage,
        curves=Curves(base=_losses(base.memorization), head=_losses(head.memorization)),
        left_out=LeftOut(base=base.left_out, head=head.left_out),
        warnings=warnings,
        verdict=verdict,
        passed=utilization is None or utilization.passed,
    )


def _losses(report: Memorization | None) -> list[float]:
    """The curve's finite losses (NaN, written as text, and null left out)."""
    values = report.losses if report is not None else []
    return [v for v in map(number, values) if v is not None]


@dataclass
class Outcome:
    """What ``dlci baseline`` reports: the Markdown, the verdict, what fails, what warns."""

    markdown: str
    verdict: str  # passed, failed, inconclusive, not comparable, or none (no baseline)
    failures: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what was done (the comment), for the log
    outputs: dict[str, str] = field(default_factory=dict)
    result: Comparison | None = None


def against_baseline(
    *,
    artifacts: Path,
    host_record: Path | None,
    spec: str,
    base_dir: Path | None,
    prefix: str,
    token: str,
    max_utilization_drop: float | None,
    max_step_time: float | None,
    comment: bool,
    block_likely: bool = False,
) -> Outcome:
    """This run's verified reports against the baseline (``base_dir``, else fetched by
    ``spec``), rendered; a problem on the way is a warning and "no baseline", never a failure."""
    head = head_side(artifacts, host_record)
    api: GitHub | None = None
    with tempfile.TemporaryDirectory(prefix="dlci-base-") as tmp:
        source = BaselineSource(folder=str(base_dir)) if base_dir else BaselineSource()
        misread: list[str] = []
        if base_dir is not None and (base_dir / SOURCE_FILE).is_file():  # fetched before the job
            source = _kept_source(base_dir / SOURCE_FILE, source, misread)
        folder, skipped, problem = base_dir, [], ""
        if base_dir is None or comment:
            try:
                api = GitHub.from_environment(token)
            except ApiError as exc:
                outside = (
                    "" if in_github_actions() else ": outside GitHub Actions pass --base-dir DIR"
                )
                problem = f"{exc}{outside if base_dir is None else ''}"
        passed_over: list[int] = []
        if base_dir is None and api is not None:
            name = f"{prefix}-{head.hardware_class}-" if head.hardware_class else f"{prefix}-"
            rest = JOB_ID if head.hardware_class else None  # no other class's name goes on so
            fetched = fetch(api, spec, prefix=name, into=Path(tmp) / "base", rest=rest)
            folder, skipped, problem = fetched.folder, fetched.skipped, fetched.problem
            run = {**fetched.run, "artifact": fetched.artifact}
            source = _source(run, BaselineSource(artifact=fetched.artifact), misread)
            passed_over = fetched.passed_over
        if folder is None:
            reason = f"no baseline: {problem}"
            out = Outcome(render_none(reason), "none", warnings=[reason], outputs=_outputs("none"))
        else:
            out = _compared(
                base_side(folder), head, source, max_utilization_drop, max_step_time, block_likely
            )
            out.warnings += [f"baseline: left out {item}" for item in skipped]
            out.warnings += [f"baseline: where it came from is unknown: {why}" for why in misread]
            if passed_over:
                out.warnings.append(
                    f"baseline: passed over {len(passed_over)} newer run(s) without an artifact "
                    f"of this class ({', '.join(map(str, passed_over[:5]))})"
                )
    if comment and api is not None:
        out.notes.append(sticky_comment(api, out.markdown, MARKER))
    elif comment:
        out.notes.append(f"no comment: {problem}")
    return out


def _kept_source(path: Path, otherwise: BaselineSource, misread: list[str]) -> BaselineSource:
    """baseline-source.json as the step before the job left it beside the reports (a file in
    a folder: outside input), else ``otherwise``, with why in ``misread``."""
    try:
        raw = read_json(path)
    except (DlciError, jsonio.DecodeError, RecursionError) as exc:
        misread.append(f"{path.name}: unreadable ({str(exc)[:200]})")
        return otherwise
    return _source(raw, otherwise, misread)


def _source(raw: Any, otherwise: BaselineSource, misread: list[str]) -> BaselineSource:
    """Where the baseline came from (a file of outside input, the API's run), else
    ``otherwise``, with why in ``misread``; a file that holds no object: ``otherwise``."""
    if not isinstance(raw, dict):
        return otherwise
    try:
        return read_source(raw)
    except ValueError as exc:
        misread.append(str(exc)[:400])
        return otherwise


def _compared(
    base: Side,
    head: Side,
    source: BaselineSource,
    max_utilization_drop: float | None,
    max_step_time: float | None,
    block_likely: bool = False,
) -> Outcome:
    max_utilization_drop = bound(max_utilization_drop, head, "max-utilization-drop")
    max_step_time = bound(max_step_time, head, "max-step-time-regression")
    result = compare_sides(
        base, head, max_utilization_drop=max_utilization_drop, max_step_time=max_step_time,
        block_likely=block_likely,
    )  # fmt: skip
    result.source = source
    out = Outcome(render(result), result.verdict, result=result)
    out.warnings += result.warnings
    utilization = result.utilization
    out.failures = [
        f"{row.metric} regressed against the baseline: {row.reason}"
        for row in (utilization.regressions if utilization is not None else [])
    ]
    out.warnings += [
        f"{row.metric} likely regressed against the baseline (not blocking: the input "
        f"block-likely-regressions): {row.reason}"
        for row in (utilization.rows if utilization is not None else [])
        if row.verdict == "likely regressed" and not row.regressed
    ]
    run = None if isinstance(source.id, msgspec.UnsetType) else source.id
    out.outputs = _outputs(result.verdict, run)
    return out


def _outputs(verdict: str, run: int | str | None = None) -> dict[str, str]:
    return {"comparison": verdict, "baseline-run": "" if run is None else str(run)}
