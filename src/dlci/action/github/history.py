"""The nightly history carried forward as an artifact: last night's, plus tonight's entry.

Host-side (no torch). The previous history is ``history.json`` from the newest finished run
of this workflow on this branch (its history artifact, fetched as a baseline is:
:mod:`dlci.action.github.artifacts`), a file, or none. Tonight's entry comes from the reports in the
artifacts folder, read and checked as a baseline's are. A history that cannot be fetched or
read starts afresh, with a warning: a history never fails a night.
"""

from __future__ import annotations

import datetime
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from dlci import jsonio
from dlci.action.github.api import ApiError, GitHub
from dlci.action.github.artifacts import fetch
from dlci.action.github.sides import base_side
from dlci.compare.diff import median_step_us
from dlci.errors import DlciError
from dlci.fsutil import atomic_write_text, read_input
from dlci.report import history as render
from dlci.report.fields import History, HistoryEntry
from dlci.report.history import NAMED, checked, empty

HISTORY_NAME = "history.json"
PLOT_NAME = "trend.svg"
MARKDOWN_NAME = "history.md"


@dataclass
class Updated:
    """The history after tonight, its Markdown, drift found, warnings, the files written."""

    history: History
    markdown: str
    drift: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    written: list[Path] = field(default_factory=list)


def entry(folder: Path, environ: dict[str, str] | os._Environ[str]) -> HistoryEntry | None:
    """Tonight's figures from the reports in ``folder``; None when it holds none."""
    side = base_side(folder)
    if side.utilization is None and side.memorization is None:
        return None
    util, mem = side.utilization, side.memorization
    steps = mem.steps if mem is not None and mem.verdict == "pass" else None
    loss = mem.final_loss if mem is not None else None
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%MZ")
    night = HistoryEntry(
        date=environ.get("DLCI_HISTORY_DATE") or stamp,
        run_id=environ.get("GITHUB_RUN_ID") or None,
        sha=environ.get("GITHUB_SHA") or None,
        hardware_class=side.hardware_class or "unknown",
        torch=side.environment().torch,
        gpu_utilization_pct=util.gpu_utilization_pct if util else None,
        step_time_us=median_step_us(util) if util else None,
        epochs_to_threshold=steps,
        final_loss=loss if isinstance(loss, int | float) else None,
        coverage_pct=side.coverage,
    )
    if mem is not None:  # the tier tonight's memorization was judged at (unknown: None)
        night.budget = mem.tier.budget[:200] or None
        night.ladder_revision = mem.tier.ladder_revision[:200] or None
        night.threshold_form = mem.threshold_form[:200] or "absolute"
        night.threshold = mem.threshold
        night.relative_threshold = mem.relative_threshold
        night.max_epochs = mem.tier.max_epochs or None
    return night


def previous(
    spec: str, *, token: str, artifact: str, environ: dict[str, str] | os._Environ[str]
) -> tuple[History, list[str]]:
    """The history so far: ``none``, ``auto`` (the newest finished run of the branch's own that
    kept the history artifact: :func:`dlci.action.github.artifacts.fetch`) or a file."""
    if spec == "none":
        return empty(), []
    notes: list[str] = []
    with tempfile.TemporaryDirectory(prefix="dlci-history-") as tmp:
        path = Path(spec)
        if spec == "auto":
            try:
                api = GitHub.from_environment(token)
            except ApiError as exc:
                outside = environ.get("GITHUB_ACTIONS") != "true"
                hint = ": outside GitHub Actions pass --previous FILE" if outside else ""
                return empty(), [f"no previous history, starting a new one: {exc}{hint}"]
            got = fetch(
                api, "auto", prefix=artifact, into=Path(tmp), names=(HISTORY_NAME,),
                status="completed", environ=environ,
            )  # fmt: skip
            if got.problem or got.skipped:
                why = got.problem or "; ".join(got.skipped)
                return empty(), [f"no previous history, starting a new one: {why}"]
            if got.passed_over:
                notes.append(
                    f"{len(got.passed_over)} newer finished run(s) kept no {artifact} artifact "
                    f"(their nights are not in the history): carried on from run {got.run['id']}"
                )
            path = Path(tmp) / HISTORY_NAME
        try:
            data = jsonio.decode(read_input(path, what="history"))
        except (DlciError, jsonio.DecodeError, RecursionError) as exc:
            return empty(), [f"the previous history is unreadable, starting a new one: {exc}"]
    history, dropped, named_entries = checked(data)
    named = "; ".join(named_entries[: NAMED + 1])
    warnings = [f"{dropped} malformed history entries were left out: {named}"] if dropped else []
    return history, notes + warnings


def update(
    *,
    previous_spec: str,
    artifacts: Path | None,
    out: Path,
    token: str,
    artifact: str,
    bounds: dict[str, float | None],
    environ: dict[str, str] | os._Environ[str] = os.environ,
) -> Updated:
    """The previous history, tonight's entry appended, drift judged; the files written."""
    history, warnings = previous(previous_spec, token=token, artifact=artifact, environ=environ)
    if artifacts is None:
        warnings.append("no --append: nothing added tonight")
    else:
        tonight = entry(artifacts, environ)
        if tonight is None:
            warnings.append(f"{artifacts} holds no report: no entry tonight")
        else:
            history = render.append(history, tonight)
    found = render.drift(history, bounds)
    markdown = render.render_markdown(history, found)
    done = Updated(history, markdown, warnings=warnings)
    done.drift = [
        f"{f.hardware_class}: {f.title} drifted: {f.reason}"
        for f in found
        if f.verdict == "regressed"
    ]
    out.mkdir(parents=True, exist_ok=True)
    done.written.append(jsonio.write(out / HISTORY_NAME, history))
    done.written.append(atomic_write_text(out / PLOT_NAME, render.svg(history)))
    done.written.append(atomic_write_text(out / MARKDOWN_NAME, markdown))
    return done
