"""This run against its baseline: memorization, utilization and coverage side by side.

Host-side (no torch). HEAD is this job's reports as the summary step verified them (the
host's copy, checked again against the host's record: a report the record does not vouch
for is left out); BASE is another run's reports (:mod:`dlci.action.baseline`, or a folder).
Both are outside input, read under caps and checked field by field. Utilization is judged
with statistics (:mod:`dlci.report.diff`): a bound fails the job only when it is exceeded
with confidence; memorization and coverage are shown, not gated.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dlci import jsonio
from dlci.errors import DlciError
from dlci.fsutil import read_input

MAX_LOSSES = 100_000  # points of a memorization curve read from a report


@dataclass
class Side:
    """One run's reports, as far as they are there and well formed."""

    utilization: dict[str, Any] | None = None
    memorization: dict[str, Any] | None = None
    coverage: float | None = None
    hardware_class: str | None = None
    left_out: list[str] = field(default_factory=list)

    def environment(self) -> dict[str, Any]:
        """The hardware class and torch version this run reported (None: unknown)."""
        versions = ((self.memorization or {}).get("config") or {}).get("versions") or {}
        torch = versions.get("torch") if isinstance(versions, dict) else None
        return {
            "hardware_class": self.hardware_class,
            "torch": torch if isinstance(torch, str) else None,
        }


def _json(path: Path) -> Any:
    return jsonio.decode(read_input(path, what="report"))


def _checked(path: Path, kind: str, side: Side) -> dict[str, Any] | None:
    """A report of ``kind`` from ``path`` whose fields the comparison reads are sound."""
    from dlci.report.diff import check_report
    from dlci.report.runs import check_run

    if not path.is_file():
        return None
    try:
        data = _json(path)
    except (DlciError, jsonio.DecodeError, RecursionError) as exc:
        side.left_out.append(f"{path.name}: unreadable ({str(exc)[:200]})")
        return None
    if not isinstance(data, dict) or data.get("kind") != kind:
        side.left_out.append(f"{path.name}: not a {kind} report")
        return None
    check = check_report if kind == "utilization" else _check_memorization
    problem = check(data) or (check_run(data) if kind == "memorization" else None)
    if problem:
        side.left_out.append(f"{path.name}: {problem}")
        return None
    return data


def _check_memorization(report: dict[str, Any]) -> str | None:
    losses = report.get("losses")
    if losses is None:
        return None
    if not isinstance(losses, list) or len(losses) > MAX_LOSSES:
        return f"losses: expected a list of at most {MAX_LOSSES} numbers"
    if any(isinstance(v, bool) or not isinstance(v, int | float | str) for v in losses):
        return "losses: expected numbers"
    return None


def base_side(folder: Path) -> Side:
    """The baseline's reports from ``folder`` (outside input: every field checked)."""
    from dlci.action.summary import coverage_rate

    side = Side()
    side.utilization = _checked(folder / "utilization.json", "utilization", side)
    side.memorization = _checked(folder / "memorization.json", "memorization", side)
    side.coverage = coverage_rate(folder / "coverage.xml")
    try:
        preflight = (
            _json(folder / "preflight.json") if (folder / "preflight.json").is_file() else {}
        )
    except (DlciError, jsonio.DecodeError, RecursionError):
        preflight = {}
    side.hardware_class = _hardware_class(preflight, side.memorization)
    return side


def head_side(folder: Path, host_record: Path | None) -> Side:
    """This run's reports as the summary step verified them (the host's record), checked."""
    from dlci.action.summary import collect

    data = collect(folder, host_record)
    side = Side(coverage=data["coverage"])
    for key in ("utilization", "memorization"):
        if data[key] is not None:
            setattr(side, key, _checked(folder / f"{key}.json", key, side))
    side.hardware_class = _hardware_class(data["preflight"], side.memorization)
    return side


def _hardware_class(preflight: Any, memorization: dict[str, Any] | None) -> str | None:
    tier = preflight.get("tier") if isinstance(preflight, dict) else None
    value = tier.get("hardware_class") if isinstance(tier, dict) else None
    if value is None and memorization:
        value = (memorization.get("tier") or {}).get("hardware_class")
    return str(value)[:80] if isinstance(value, str) else None


def memorization_rows(base: Side, head: Side) -> list[dict[str, Any]]:
    """Epochs to the threshold and the final loss, side by side (not gated)."""
    rows: list[dict[str, Any]] = []
    b, h = base.memorization or {}, head.memorization or {}
    if not (b or h):
        return rows

    def epochs(report: dict[str, Any]) -> int | None:
        steps = report.get("steps")
        return steps if report.get("verdict") == "pass" and isinstance(steps, int) else None

    rows.append(_plain("epochs_to_threshold", epochs(b), epochs(h), "count"))
    rows.append(
        _plain("final_loss", _number(b.get("final_loss")), _number(h.get("final_loss")), "loss")
    )
    tb, th = _number(b.get("threshold")), _number(h.get("threshold"))
    if tb is not None and th is not None and tb != th:  # another tier: other epochs to reach
        for row in rows:
            row["verdict"] = "not comparable"
            row["reason"] = f"loss thresholds {tb:g} (base) and {th:g} (head): another tier"
    return rows


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _plain(metric: str, b: float | None, h: float | None, unit: str) -> dict[str, Any]:
    change = None if b is None or h is None else h - b
    return {
        "metric": metric,
        "base": b,
        "head": h,
        "change": change,
        "unit": unit,
        "verdict": "not gated",
        "reason": "",
    }


def compare_sides(
    base: Side, head: Side, *, max_utilization_drop: float | None, max_step_time: float | None
) -> dict[str, Any]:
    """The side-by-side result: rows by section, the utilization diff, the verdict."""
    from dlci.report import diff

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
        )
    coverage = []
    if base.coverage is not None or head.coverage is not None:
        coverage.append(_plain("coverage", base.coverage, head.coverage, "percentage points"))
    verdict = "passed" if utilization is None else utilization["verdict"]
    return {
        "schema_version": 1,
        "kind": "baseline-comparison",
        "memorization": memorization_rows(base, head),
        "utilization": utilization,
        "coverage": coverage,
        "curves": {
            "base": _losses(base.memorization),
            "head": _losses(head.memorization),
        },
        "left_out": {"base": base.left_out, "head": head.left_out},
        "verdict": verdict,
        "passed": utilization is None or bool(utilization["passed"]),
    }


def _losses(report: dict[str, Any] | None) -> list[float]:
    values = (report or {}).get("losses") or []
    return [float(v) for v in values if isinstance(v, int | float) and not isinstance(v, bool)]


@dataclass
class Outcome:
    """What ``dlci baseline`` reports: the Markdown, the verdict, what fails, what warns."""

    markdown: str
    verdict: str  # passed, failed, inconclusive, not comparable, or none (no baseline)
    failures: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what was done (the comment), for the log
    outputs: dict[str, str] = field(default_factory=dict)
    result: dict[str, Any] | None = None


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
) -> Outcome:
    """This run's verified reports against the baseline (``base_dir``, else fetched by
    ``spec``), rendered; a problem on the way is a warning and "no baseline", never a failure."""
    import tempfile

    from dlci.action.baseline import fetch
    from dlci.action.github_api import ApiError, GitHub
    from dlci.report.comparison import MARKER, render_none

    head = head_side(artifacts, host_record)
    api: GitHub | None = None
    with tempfile.TemporaryDirectory(prefix="dlci-base-") as tmp:
        source: dict[str, Any] = {"folder": str(base_dir)} if base_dir else {}
        folder, skipped, problem = base_dir, [], ""
        if base_dir is None or comment:
            try:
                api = GitHub.from_environment(token)
            except ApiError as exc:
                problem = str(exc)
        if base_dir is None and api is not None:
            name = f"{prefix}-{head.hardware_class}-" if head.hardware_class else f"{prefix}-"
            fetched = fetch(api, spec, prefix=name, into=Path(tmp) / "base")
            folder, skipped, problem = fetched.folder, fetched.skipped, fetched.problem
            source = {**fetched.run, "artifact": fetched.artifact}
        if folder is None:
            reason = f"no baseline: {problem}"
            out = Outcome(render_none(reason), "none", warnings=[reason], outputs=_outputs("none"))
        else:
            out = _compared(base_side(folder), head, source, max_utilization_drop, max_step_time)
            out.warnings += [f"baseline: left out {item}" for item in skipped]
    if comment and api is not None:
        from dlci.action.comment import sticky_comment

        out.notes.append(sticky_comment(api, out.markdown, MARKER))
    elif comment:
        out.notes.append(f"no comment: {problem}")
    return out


def _compared(
    base: Side,
    head: Side,
    source: dict[str, Any],
    max_utilization_drop: float | None,
    max_step_time: float | None,
) -> Outcome:
    from dlci.report.comparison import render

    result = compare_sides(
        base, head, max_utilization_drop=max_utilization_drop, max_step_time=max_step_time
    )
    result["source"] = source
    out = Outcome(render(result), result["verdict"], result=result)
    out.failures = [
        f"{row['metric']} regressed against the baseline: {row['reason']}"
        for row in (result["utilization"] or {}).get("regressions", [])
    ]
    out.outputs = _outputs(result["verdict"], source.get("id"))
    return out


def _outputs(verdict: str, run: Any = None) -> dict[str, str]:
    return {"comparison": verdict, "baseline-run": "" if run is None else str(run)}
