"""The gate a bisect judges each commit by: the ``dlci`` command line of one run, and what
its JSON report says (pass, fail, or skip: the commit could not be run), with the figures
and how near the threshold it came.

- ``memorize``: the memorization test at the given tier; re-runs take other seeds. Near its
  threshold: a pass that needed more than ``1 - near`` of the tier's epochs, a fail whose
  best relative loss came within ``1 + near`` times the goal, or a curve the verdict itself
  calls still falling or noisy. Its noise is one-sided (a broken loop does not memorize by
  luck), so a pass at the boundary is not confirmed.
- ``profile``: GPU utilization at least ``--min-gpu-util`` percent (the profile's own gate
  decides it, dlci.profiling.gate: its min-gpu-util check is read here), or a median step time
  at most ``--max-step-time-ms``; near: within ``near`` of the bound (relative). Its noise
  is two-sided: both sides of the boundary are confirmed.
- ``doctor``: one check (``--check ID``) must not fail; a doctor check is judged on fixed
  seeds, so nothing is near and a re-run repeats the same seed.

A run that ends without a verdict of the gate (a target that cannot be imported or built,
a process killed, a report missing) is a skip, as ``git bisect skip``; ``errors_fail``
counts such a run as a fail instead (to find the commit that began to raise).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dlci import jsonio
from dlci.compare.diff import median_step_us
from dlci.errors import DlciError
from dlci.fsutil import read_input
from dlci.report import doctor, utilization
from dlci.report.fields import GateCheck, Utilization

GATES = ("memorize", "profile", "doctor")
REPORTS = {"memorize": "memorization.json", "profile": "utilization.json", "doctor": "doctor.json"}
NO_VERDICT = ("error", "exited")  # a memorization report's stopped_by with no gate verdict
MAX_REPORT = 64 << 20


@dataclass
class Judged:
    """One gate run: a verdict per seed, the figures, near the threshold or not, why."""

    verdicts: list[str]
    figures: dict[str, Any] = field(default_factory=dict)
    near: bool = False
    reason: str = ""


@dataclass(frozen=True)
class Gate:
    kind: str = "memorize"
    passthrough: tuple[str, ...] = ()  # --target, --budget, --hardware, --ladder, --device ...
    min_gpu_util: float | None = None
    max_step_time_ms: float | None = None
    check: str | None = None
    near: float = 0.25
    errors_fail: bool = False

    def __post_init__(self) -> None:
        if self.kind not in GATES:
            raise DlciError(f"--gate {self.kind!r}: choose from {', '.join(GATES)}")
        bounds = (self.min_gpu_util, self.max_step_time_ms)
        if self.kind == "profile" and sum(b is not None for b in bounds) != 1:
            raise DlciError(
                "--gate profile needs one bound: --min-gpu-util PCT or --max-step-time-ms MS",
                hint="for example --gate profile --min-gpu-util 40",
            )
        if self.kind == "doctor" and not self.check:
            raise DlciError("--gate doctor needs --check ID", hint="for example --check grad-flow")
        if not 0 <= self.near < 1:
            raise DlciError(f"--near must be from 0 to below 1, got {self.near:g}")

    @property
    def confirm_passes(self) -> bool:
        return self.kind == "profile"

    @property
    def report_name(self) -> str:
        return REPORTS[self.kind]

    def describe(self) -> str:
        """The gate in words, for the cost line and the reports.

        >>> Gate("profile", min_gpu_util=40).describe()
        'profile: GPU utilization >= 40%'
        """
        if self.kind == "profile":
            if self.min_gpu_util is not None:
                return f"profile: GPU utilization >= {self.min_gpu_util:g}%"
            return f"profile: median step time <= {self.max_step_time_ms:g} ms"
        if self.kind == "doctor":
            return f"doctor: check {self.check}"
        options = " ".join(self.passthrough)
        return f"memorize{(' ' + options) if options else ''}"

    def argv(self, out: Path, seed: int, seeds: int) -> list[str]:
        """The ``dlci`` arguments of one run into ``out`` (seeds ``seed``.. ``seed+seeds-1``
        for memorize; the other gates run one seed)."""
        common = ["--out", str(out), "--seed", str(seed), *self.passthrough]
        if self.kind == "memorize":
            many = ["--seeds", str(seeds), "--quorum", "1"] if seeds > 1 else []
            json = ["--json", str(out / self.report_name)]
            return ["memorize", *common, *json, "--quiet", "--tracker", "none", *many]
        if self.kind == "profile":  # writes OUT/utilization.json, with its gate's verdict
            gate = [] if self.min_gpu_util is None else ["--min-gpu-util", f"{self.min_gpu_util:g}"]
            return ["profile", *common, "--quiet", "--no-memory", *gate]
        return ["doctor", *common, "--json", str(out / self.report_name), "--only", str(self.check)]

    def judge(self, out: Path, exit_code: int, seeds: int, stderr_tail: str) -> Judged:
        """What the run's report says; a run with no report or no verdict is a skip."""
        path = out / self.report_name
        try:
            report = jsonio.decode(read_input(path, what="the gate's report", limit=MAX_REPORT))
        except (DlciError, jsonio.DecodeError, OSError, RecursionError):
            report = None
        if not isinstance(report, dict):
            why = f"no report (exit {exit_code})" + (f": {stderr_tail}" if stderr_tail else "")
            return self._unjudged(seeds, why)
        if self.kind == "memorize":
            return self._memorize(report, seeds)
        if self.kind == "profile":
            return self._profile(report, exit_code)
        return self._doctor(report, exit_code)

    def _unjudged(self, seeds: int, why: str) -> Judged:
        verdict = "fail" if self.errors_fail else "skip"
        return Judged([verdict] * seeds, {}, False, why)

    def _memorize(self, report: dict[str, Any], seeds: int) -> Judged:
        reason = str(report.get("reason") or "")
        if report.get("stopped_by") in NO_VERDICT:
            return self._unjudged(seeds, f"no verdict: {reason}")
        section = report.get("seeds")
        runs = section.get("runs") if isinstance(section, dict) else None
        if isinstance(runs, list) and runs:
            verdicts = [str(r.get("verdict")) if isinstance(r, dict) else "fail" for r in runs]
        else:
            verdicts = [str(report.get("verdict"))]
        verdicts = ["pass" if v == "pass" else "fail" for v in verdicts]
        raw_tier = report.get("tier")
        tier: dict[str, Any] = raw_tier if isinstance(raw_tier, dict) else {}
        figures = {
            key: report.get(key)
            for key in ("case", "steps", "best_loss", "start_loss", "relative_loss",
                        "relative_threshold", "threshold", "stopped_by")
        }  # fmt: skip
        figures["max_epochs"] = tier.get("max_epochs")
        return Judged(verdicts, figures, self._memorize_near(report, figures), reason)

    def _memorize_near(self, report: dict[str, Any], figures: dict[str, Any]) -> bool:
        if report.get("case") in ("still-falling", "noisy"):
            return True
        steps, epochs = figures["steps"], figures["max_epochs"]
        if report.get("verdict") == "pass":
            return bool(_num(steps) and _num(epochs) and steps > (1 - self.near) * epochs)
        relative, goal = figures["relative_loss"], figures["relative_threshold"]
        if _num(relative) and _num(goal) and goal > 0:
            return bool(relative <= goal * (1 + self.near))
        loss, goal = figures["best_loss"], figures["threshold"]
        return bool(_num(loss) and _num(goal) and goal > 0 and loss <= goal * (1 + self.near))

    def _profile(self, raw: dict[str, Any], exit_code: int) -> Judged:
        try:
            report = utilization.read(raw)
        except ValueError as exc:  # a field of a wrong type, or a required one missing
            return self._unjudged(1, f"{exc} (exit {exit_code})")
        util = report.gpu_utilization_pct
        step_us = median_step_us(report)
        figures = {"gpu_utilization_pct": util, "step_time_ms": step_us and step_us / 1e3}
        value: Any
        if self.min_gpu_util is not None:
            value, bound, what = util, self.min_gpu_util, "GPU utilization"
        else:
            value, bound = figures["step_time_ms"], self.max_step_time_ms or 0.0
            what = "median step time"
        if not _num(value):
            return self._unjudged(1, f"the profile measured no {what} (exit {exit_code})")
        value = float(value)
        if self.min_gpu_util is not None:  # the verdict is the profile gate's, read
            check = _utilization_check(report)
            if check is None or not check.judged:
                why = check.message if check else "no min-gpu-util gate in the report"
                return self._unjudged(1, f"the profile's gate gave no verdict: {why}")
            passed = check.passed
        else:
            passed = value <= bound
        near = bound > 0 and abs(value - bound) <= self.near * bound
        shown = f"{what} {value:.4g} against the bound {bound:g}"
        return Judged(["pass" if passed else "fail"], figures, near, shown)

    def _doctor(self, raw: dict[str, Any], exit_code: int) -> Judged:
        try:
            report = doctor.read(raw)
        except ValueError as exc:  # a field of a wrong type, or a required one missing
            return self._unjudged(1, f"{exc} (exit {exit_code})")
        found = [c for c in report.checks if c.id == self.check]
        if not found or found[0].status in ("skip", "crashed"):
            status = found[0].status if found else "missing"
            return self._unjudged(1, f"check {self.check}: {status}")
        check = found[0]
        figures = {"status": check.status, "measured": check.measured}
        verdict = "fail" if check.status == "fail" else "pass"
        reason = f"{self.check}: {check.status}: {check.measured or ''}".rstrip(": ")
        return Judged([verdict], figures, False, reason)


def _num(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _utilization_check(report: Utilization) -> GateCheck | None:
    """The min-gpu-util check of the profile's gate (its gate's checks), as
    dlci.profiling.gate decided it; None when the report has none."""
    checks = (report.gate.checks or []) if report.gate else []
    return next((check for check in checks if check.name == "min-gpu-util"), None)
