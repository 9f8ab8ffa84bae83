"""A whole memorization run, as ``dlci memorize`` makes it: choose the tier, relaunch under
torchrun for DDP, train, then write the report, the curve, the tracking and the step outputs."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dlci import jsonio
from dlci.errors import DlciError
from dlci.memorization.engine import Distributed, MemorizeResult
from dlci.report.text import clean

DISTRIBUTED_FLAG = "DLCI_MEMORIZE_WORKER"  # set in torchrun's workers, so they do not relaunch
# The workers' arguments travel in the environment: torchrun's own parser would otherwise
# take options such as --nproc as abbreviations of its own.
ARGV_VARIABLE = "DLCI_MEMORIZE_ARGV"
VERDICT_VARIABLE = "DLCI_MEMORIZE_VERDICT"  # where rank 0 writes pass or fail for the launcher
WATCHDOG_VARIABLE = "DLCI_WATCHDOG"  # "off": no watchdog inside a step (for dl-ci's own tests)
NO_VERDICT = (
    "the run ended before a verdict: the process stopped inside the target's code "
    "(os._exit, a signal, or out of memory) before dl-ci could judge it"
)

Say = Callable[[str], None]  # one line for the user, on standard error


@dataclass(frozen=True)
class MemorizeRequest:
    """What ``dlci memorize`` was asked for, its options as parsed."""

    target: str | None = None
    budget: str = "auto"
    hardware: str = "auto"
    ladder: str | None = None
    detection: dict[str, Any] = field(default_factory=dict)  # hardware.detect's options
    out: str = "dlci-artifacts"
    json: str | None = None  # None: OUT/memorization.json; "-": standard output
    seed: int = 0
    device: str | None = None
    nproc: int | None = None  # None: the tier's
    early_stop: bool = True
    tracker: str = "tensorboard"
    quiet: bool = False
    argv: tuple[str, ...] = ()  # the command line, run again in each DDP process
    seeds: int = 1  # seeds run in turn (seed, seed + 1, ...): memorization/seeds.py
    quorum: int | None = None  # seeds that must pass; None: all


@dataclass
class MemorizeOutcome:
    """The exit code, and on the process that reports (rank 0) the report and where it went."""

    exit_code: int
    report: dict[str, Any] | None = None
    json_path: str = ""  # "-": the caller prints the report on standard output
    curve: Path | None = None


def is_worker() -> bool:
    """Whether this process is one of the DDP processes a launcher started."""
    return os.environ.get(DISTRIBUTED_FLAG) == "1"


def worker_argv(argv: Sequence[str]) -> list[str]:
    """The command line; in a DDP process started without one, the launcher's."""
    if is_worker() and not argv:
        return [str(arg) for arg in jsonio.decode(os.environ.get(ARGV_VARIABLE) or "[]")]
    return list(argv)


def run_memorize(request: MemorizeRequest, say: Say) -> MemorizeOutcome:
    """Run the memorization test as ``request`` asks; a failed test is an outcome, not an error."""
    from dlci.ladder.tiers import choose_tier
    from dlci.memorization.target import resolve_spec

    check_out(request.out)
    spec = resolve_spec(request.target)
    tier = choose_tier(
        budget=request.budget,
        hardware=request.hardware,
        ladder=request.ladder,
        **request.detection,
    )
    nproc = request.nproc if request.nproc is not None else tier.nproc
    if nproc < 1:
        raise DlciError(f"--nproc must be at least 1, got {nproc}", hint="use --nproc 2")
    if request.seeds != 1 or request.quorum is not None:
        from dlci.memorization.seeds import check_seeds

        check_seeds(request.seeds, request.quorum, nproc)
    if nproc > 1 and not is_worker():
        from dlci.memorization.launch import launch

        return MemorizeOutcome(launch(request.argv, nproc, say, quiet=request.quiet))
    return _run(request, spec, tier, say)


def check_out(out: str) -> None:
    """--out is a directory, or a path where one can be made: not a file, nor under one.

    Checked before anything runs, so the mistake is one message, not a crash at the end.
    """
    path = Path(out)
    for place in (path, *path.parents):
        if place.is_dir():
            return
        if os.path.lexists(place):
            what = "is a file" if place.is_file() else "is not a directory"
            where = "" if place == path else f" (its parent {place} {what})"
            raise DlciError(
                f"--out {out}: " + (what if place == path else "cannot be made") + where,
                hint="give --out a directory for the reports; it is made if it does not exist",
            )


def _run(request: MemorizeRequest, spec: str, tier: Any, say: Say) -> MemorizeOutcome:
    dist = Distributed.from_env()
    if dist.active:
        from dlci.memorization.launch import init_process_group

        init_process_group(dist)
    report = _Report(request, spec, tier) if dist.rank == 0 else None
    try:
        if report is not None:  # a failing report first: it stays if the process dies
            report.write_partial("exited", NO_VERDICT)
        return _memorize(request, spec, tier, dist, say, report)
    except DlciError as exc:
        if report is None:
            return MemorizeOutcome(1)  # rank 0 reports the same mistake; one message is enough
        with contextlib.suppress(OSError, DlciError):  # the error itself is what counts
            where = f"{exc.location}: " if exc.location else ""
            report.write_partial("error", where + exc.message)
        raise
    finally:
        if dist.active:
            import torch.distributed

            torch.distributed.destroy_process_group()


class _Report:
    """memorization.json of rank 0: a partial one (failing) until the verdict replaces it."""

    def __init__(self, request: MemorizeRequest, spec: str, tier: Any) -> None:
        from dlci.report import memorization

        self.request, self.spec, self.tier = request, spec, tier
        self.path = request.json or str(Path(request.out) / memorization.REPORT_NAME)

    def build(self, result: MemorizeResult, tracking: str = "") -> dict[str, Any]:
        from dlci.report import memorization

        return memorization.build_report(
            result=result,
            tier=self.tier.to_dict(),
            seed=self.request.seed,
            target=self.spec,
            gpu_name=_gpu_name(result.device),
            tracking=tracking,
        )

    def write_partial(self, stopped_by: str, reason: str, result: Any = None) -> None:
        from dlci.memorization.verdict import partial

        if self.path == "-":
            return
        if result is None:
            result = partial(stopped_by=stopped_by, reason=reason, losses=[])
        jsonio.write(self.path, self.build(result))


def _memorize(
    request: MemorizeRequest,
    spec: str,
    tier: Any,
    dist: Distributed,
    say: Say,
    report: _Report | None,
) -> MemorizeOutcome:
    from dlci.memorization.tracking import NullTracker, make_tracker

    if request.seeds > 1:
        from dlci.memorization.seeds import run_seeds

        return run_seeds(request, spec, tier, say, report)
    leader = report is not None
    out = Path(request.out)
    tracker = make_tracker(request.tracker, out, "memorize") if leader else NullTracker()
    outcome = MemorizeOutcome(0)
    try:
        result = train_one(request, spec, tier, dist, say, report, tracker)
        if leader:
            outcome = write_run_outputs(request, spec, tier, result, tracker)
    finally:
        tracker.close()
    if dist.active:
        if leader:
            Path(os.environ[VERDICT_VARIABLE]).write_text(result.verdict)
        outcome.exit_code = 0  # the launcher turns the verdict into the exit code
    else:
        outcome.exit_code = 0 if result.passed else 1
    return outcome


def train_one(
    request: MemorizeRequest,
    spec: str,
    tier: Any,
    dist: Distributed,
    say: Say,
    report: _Report | None,
    tracker: Any,
) -> MemorizeResult:
    """One memorization run with ``request.seed``: seed, build the target, train."""
    from dlci.memorization.engine import MemorizeConfig, memorize, seed_everything
    from dlci.memorization.target import load_target
    from dlci.progress import StepProgress

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


def _on_stuck(report: _Report | None, say: Say) -> Callable[[MemorizeResult], None] | None:
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
    tier: Any,
    result: MemorizeResult,
    tracker: Any,
    extra: dict[str, Any] | None = None,
) -> MemorizeOutcome:
    """The report (JSON file unless it goes to standard output; ``extra`` added to it), the
    tracker's summary, the curve and the GitHub step outputs."""
    from dlci.report import memorization
    from dlci.report.github import write_outputs

    report = memorization.build_report(
        result=result,
        tier=tier.to_dict(),
        seed=request.seed,
        target=spec,
        gpu_name=_gpu_name(result.device),
        tracking=": ".join(filter(None, (request.tracker, getattr(tracker, "location", "")))),
    )
    report.update(extra or {})
    tracker.log_config(report["config"])
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
