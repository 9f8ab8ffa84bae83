"""A whole ``dlci doctor`` run: select the checks and the tier, load the target, run the
ladder, and write the report (JSON, and Markdown on request)."""

from __future__ import annotations

import contextlib
import datetime as dt
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from dlci import jsonio
from dlci.checks import run_checks, select
from dlci.checks.base import CheckResult
from dlci.errors import DlciError
from dlci.fsutil import atomic_write_text
from dlci.ladder.tiers import TierRequest
from dlci.memorization.engine import seed_everything
from dlci.policy import Policy, threshold_table
from dlci.report import doctor as report
from dlci.report import figures, html
from dlci.report.fields import DoctorReport, PolicyEntry, WaiverEntry
from dlci.report.text import clean
from dlci.training.batching import as_pair
from dlci.training.target import load_target, resolve_spec

NO_VERDICT = (
    "the doctor ended before a verdict: the process stopped inside the target's code "
    "(os._exit, a signal, or out of memory) before the checks finished"
)


@dataclass(frozen=True)
class DoctorRequest:
    """What ``dlci doctor`` was asked for, its options as parsed."""

    target: str | None = None
    tier: TierRequest = field(default_factory=TierRequest)
    only: str | None = None  # comma-separated check IDs
    stop_on_fail: bool = False
    seed: int = 0
    device: str | None = None
    out: str = "dlci-artifacts"
    json: str | None = None  # None: OUT/doctor.json; "-": standard output
    markdown: str | None = None
    policy: Policy | None = None  # the project's waivers and thresholds; None: none, defaults
    today: dt.date = field(default_factory=dt.date.today)  # when waivers expire against


@dataclass
class DoctorOutcome:
    """The report, where its JSON went ("-": the caller prints it), the exit code and the
    folder's report.html (None when it was not written)."""

    report: DoctorReport
    json_path: str
    exit_code: int
    html: Path | None = None


def run_doctor(
    request: DoctorRequest, on_result: Callable[[CheckResult], None] | None = None
) -> DoctorOutcome:
    """Run the ladder on the request's target; ``on_result`` hears each check as it ends.

    A check that crashed (dl-ci's own error) is in the report with status ``crashed``; once
    the report is written, its exception is raised again, so the command exits 3 with the
    traceback in the error log, as for any other error of dl-ci's.
    """
    selected = select(request.only)  # a typo in --only fails before anything is loaded
    spec = resolve_spec(request.target)
    tier = request.tier.choose()
    json_path = request.json or str(Path(request.out) / report.REPORT_NAME)
    policy = request.policy or Policy()

    def unfinished(reason: str) -> None:  # a failing report until the verdict replaces it
        if json_path != "-":
            partial = report.build([], target=spec, tier=tier.to_dict(), seed=request.seed)
            jsonio.write(json_path, msgspec.structs.replace(partial, verdict="fail", reason=reason))

    unfinished(NO_VERDICT)  # stays if the process dies inside the target's code (os._exit)
    seed_everything(request.seed)
    crashes: list[BaseException] = []
    try:
        target = load_target(spec)
        results = run_checks(
            target,
            checks=selected,
            tier=tier,
            device=request.device,
            stop_on_fail=request.stop_on_fail,
            on_result=on_result,
            factory=lambda: load_target(spec),
            crashes=crashes,
            policy=policy,
            today=request.today,
        )
    except DlciError as exc:
        with contextlib.suppress(OSError, DlciError):  # the error itself is what counts
            unfinished(f"{exc.location}: {exc.message}" if exc.location else exc.message)
        raise
    data = report.build(
        results,
        target=spec,
        tier=tier.to_dict(),
        seed=request.seed,
        waivers=waiver_entries(policy, results, request.today),
        policy=policy_entry(policy),
    )
    _write(data, json_path, request.markdown)
    page = None
    if not crashes and html.report_folder(json_path, request.out):
        page = pictures(data, Path(request.out), target)
    if crashes:
        raise crashes[0]
    return DoctorOutcome(data, json_path, 1 if data.verdict == "fail" else 0, page)


def pictures(data: DoctorReport, folder: Path, target: Any) -> Path | None:
    """The doctor's figures (figures/*.png, the training examples among them: the first batch
    of the target's training loader, iterated anew) and the folder's report.html. Never the
    verdict's business: what cannot be drawn is said on standard error, and the report stands
    as written."""

    def say(line: str) -> None:
        print(f"doctor: {clean(line)}", file=sys.stderr, flush=True)

    try:
        drawn = figures.doctor_figures(data, folder).figures
    except ImportError as exc:  # matplotlib: dl-ci's train extra
        say(f"no figures: {exc} (pip install 'dl-ci[train]')")
        drawn = []
    except (OSError, DlciError, ValueError) as exc:  # figures/ not a folder, a full disk...
        say(f"no figures in {folder / figures.FOLDER}: {exc}")
        drawn = []
    else:
        try:
            example = _examples(target, folder)
        except Exception as exc:  # the target's own code: no figure, not a crash
            say(f"no figure of the training examples: {type(exc).__name__}: {exc}")
            example = None
        drawn += [example] if example else []
        if drawn:
            say(f"{len(drawn)} figures in {folder / figures.FOLDER}")
    try:
        return html.write_report(folder)
    except (OSError, DlciError) as exc:
        say(f"no {html.REPORT_NAME}: {exc}")
        return None


def _examples(target: Any, folder: Path) -> figures.Drawn | None:
    """The figure of the target's first training batch, or None for a layout it cannot draw."""
    for raw in target.train_loader:
        inputs, labels = as_pair(raw, 0)
        if isinstance(inputs, dict):  # a Transformers batch: its token ids
            inputs = inputs.get("input_ids")
        if isinstance(labels, dict):
            labels = labels.get("labels")
        return figures.examples_figure(inputs, labels, folder, vocab=getattr(target, "vocab", None))
    return None


def _write(data: DoctorReport, json_path: str, markdown: str | None) -> None:
    """The report as JSON (unless it goes to standard output) and, on request, Markdown."""
    if json_path != "-":
        jsonio.write(json_path, data)
    if markdown:
        atomic_write_text(markdown, report.render_markdown(data))


def waiver_entries(policy: Policy, results: list[CheckResult], today: dt.date) -> list[WaiverEntry]:
    """The report's ``waivers``: every waiver of the policy, whether it has expired, whether
    it applied in this run (a check not selected, or skipped by --stop-on-fail, had none
    applied), and the status its check had or would have had without it."""
    by_id = {r.id: r for r in results}
    entries = []
    for waiver in policy.waivers:
        result = by_id.get(waiver.check)
        applied = result is not None and result.waived is not None
        if result is None:
            before = None
        elif applied:
            before = (result.waived or {}).get("status_without_waiver")
        else:
            before = result.status
        entries.append(
            WaiverEntry(
                **waiver.to_json(),
                expired=waiver.expired(today),
                applied=applied,
                status_without_waiver=before,
            )
        )
    return entries


def policy_entry(policy: Policy) -> PolicyEntry:
    """The report's ``policy``: where it came from, and the thresholds that differ from the
    defaults."""
    table = threshold_table()
    changed = {
        name: value
        for name, value in policy.thresholds.items()
        if name not in table or float(value) != table[name].default
    }
    return PolicyEntry(origin=policy.origin, thresholds=changed)
