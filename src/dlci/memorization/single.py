"""One memorization run on one seed: train the target under the tier, then write the report,
the curve, the tracking and the step outputs (rank 0's partial report first, so a run that
dies still leaves a failing one)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from msgspec import UNSET, UnsetType

from dlci import jsonio
from dlci.ladder.model import Tier
from dlci.memorization.engine import (
    Distributed,
    MemorizeConfig,
    MemorizeResult,
    memorize,
    seed_everything,
)
from dlci.memorization.request import WATCHDOG_VARIABLE, MemorizeOutcome, MemorizeRequest, Say
from dlci.memorization.verdict import partial
from dlci.progress import StepProgress
from dlci.report import memorization
from dlci.report.fields import Memorization, SeedRuns
from dlci.report.github import write_outputs
from dlci.report.text import clean
from dlci.training.target import load_target


class RunReport:
    """memorization.json of rank 0: a partial one (failing) until the verdict replaces it."""

    def __init__(self, request: MemorizeRequest, spec: str, tier: Tier) -> None:
        self.request, self.spec, self.tier = request, spec, tier
        self.path = request.json or str(Path(request.out) / memorization.REPORT_NAME)

    def build(self, result: MemorizeResult, tracking: str = "") -> Memorization:
        return memorization.build_report(
            result=result,
            tier=self.tier.to_dict(),
            seed=self.request.seed,
            target=self.spec,
            gpu_name=_gpu_name(result.device),
            tracking=tracking,
        )

    def write_partial(self, stopped_by: str, reason: str, result: Any = None) -> None:
        if self.path == "-":
            return
        if result is None:
            result = partial(stopped_by=stopped_by, reason=reason, losses=[])
        jsonio.write(self.path, self.build(result))


def train_one(
    request: MemorizeRequest,
    spec: str,
    tier: Tier,
    dist: Distributed,
    say: Say,
    report: RunReport | None,
    tracker: Any,
) -> MemorizeResult:
    """One memorization run with ``request.seed``: seed, build the target, train."""
    seed_everything(request.seed + dist.rank)  # the model's initial weights come from here
    target = load_target(spec)
    config = MemorizeConfig.from_tier(
        tier, seed=request.seed, device=request.device, early_stop=request.early_stop
    )
    leader = report is not None
    label = f"memorize {tier.budget}/{tier.hardware_class}"
    label = clean(label + (f" seed {request.seed}" if request.seeds > 1 else ""))  # ladder names
    with StepProgress(tier.max_epochs, label, enabled=leader and not request.quiet) as progress:

        def on_step(step: int, loss: float, best: float) -> None:
            progress(step, loss, best)
            tracker.log_metric("memorize/loss", loss, step)

        def on_start(changes: list[str]) -> None:
            for change in changes if leader else ():
                say(f"before training: {change}")

        return memorize(
            target,
            config,
            on_step=on_step,
            on_start=on_start,
            dist=dist,
            on_stuck=_on_stuck(report, say),
        )


def _on_stuck(report: RunReport | None, say: Say) -> Callable[[MemorizeResult], None] | None:
    """What the watchdog does with the partial result: rank 0 writes it and says why."""
    if os.environ.get(WATCHDOG_VARIABLE, "").lower() in ("off", "0", "false", "no"):
        return None

    def stuck(result: MemorizeResult) -> None:
        if report is None:
            return
        report.write_partial("watchdog", result.reason, result)
        say(f"memorization FAIL: {result.reason}")
        say("the stuck thread's stack (innermost last):")
        for line in result.stack[-12:]:
            say(f"  {line}")
        if report.path != "-":
            say(f"partial report {report.path}")

    return stuck


def write_run_outputs(
    request: MemorizeRequest,
    spec: str,
    tier: Tier,
    result: MemorizeResult,
    tracker: Any,
    *,
    seeds: SeedRuns | UnsetType = UNSET,
    script_mode: bool | UnsetType = UNSET,
) -> MemorizeOutcome:
    """The report (JSON file unless it goes to standard output; with the ``seeds`` section,
    or ``script_mode``, where they apply), the tracker's summary, the curve and the GitHub
    step outputs."""
    report = memorization.build_report(
        result=result,
        tier=tier.to_dict(),
        seed=request.seed,
        target=spec,
        gpu_name=_gpu_name(result.device),
        tracking=": ".join(filter(None, (request.tracker, getattr(tracker, "location", "")))),
        seeds=seeds,
        script_mode=script_mode,
    )
    # a tracker takes plain values: the configuration as the report's JSON holds it
    tracker.log_config(jsonio.decode(jsonio.encode(report.config, indent=False)))
    tracker.log_summary(
        {
            "best_loss": float("nan") if result.best_loss is None else result.best_loss,
            "steps": result.steps,
            "passed": int(result.passed),
            "wall_time_s": result.wall_time_s,
        }
    )
    out = Path(request.out)
    json_path = request.json or str(out / memorization.REPORT_NAME)
    if json_path != "-":
        jsonio.write(json_path, report)
    curve = (
        memorization.plot_curve(report, out / memorization.CURVE_NAME) if result.losses else None
    )
    write_outputs(
        {
            "memorization-passed": result.passed,
            "memorization-loss": result.best_loss if result.best_loss is not None else "",
        }
    )
    return MemorizeOutcome(0, report=report, json_path=json_path, curve=curve)


def _gpu_name(device: str) -> str | None:
    if not device.startswith("cuda"):
        return None
    import torch

    return str(torch.cuda.get_device_name())
