"""The debugging ladder: ordered checks, cheap first, each ruling out a class of silent bug.

The check IDs are part of the interface (reports, ``--only``): keep them.
"""

from __future__ import annotations

import datetime as dt
import importlib
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dlci.checks import cascade
from dlci.checks.base import (
    CRASHED,
    FAIL,
    SKIP,
    WARN,
    CheckResult,
    Context,
    TargetFault,
    preserved,
)
from dlci.errors import DlciError
from dlci.ladder.model import Tier
from dlci.policy import CHECK_IDS, SKIP_WAIVER, WARN_ONLY, Policy, Waiver
from dlci.schema import suggest
from dlci.training.guard import (
    TargetExited,
    UserCodeError,
    exited,
    frames,
    frames_text,
    is_dlci,
    is_library,  # the one place that knows
    raised_by_dlci,
    user_frame,
    where,
)
from dlci.training.target import Target


@dataclass(frozen=True)
class Check:
    id: str
    catches: str
    run: Callable[[Context], CheckResult] | None  # None: planned, not built yet


# The ladder, in order: (ID, what it catches, module under dlci.checks, function). Plain
# strings, so the IDs are known without importing torch (``dlci doctor --help``, ``--only``);
# the functions are imported only when the checks run.
LADDER: tuple[tuple[str, str, str, str], ...] = (
    (
        "optimizer-coverage",
        "an optimizer not given all the trainable parameters",
        "setup",
        "optimizer_coverage",
    ),
    ("initial-loss", "outputs, targets or loss not what you think", "loss", "initial_loss"),
    ("loss-broadcast", "shapes that broadcast into a meaningless loss", "loss", "loss_broadcast"),
    ("train-eval-mode", "BatchNorm/Dropout in the wrong mode", "modes", "train_eval_mode"),
    ("zero-grad", "gradients accumulating across steps", "gradients", "zero_grad"),
    ("grad-flow", "gradients that never reach some parameters", "gradients", "grad_flow"),
    ("shuffle", "training data not shuffled", "data", "shuffle"),
    (
        "input-normalization",
        "inputs far from unit scale, or splits normalised differently",
        "normalization",
        "input_normalization",
    ),
    ("batch-independence", "per-batch normalization at inference", "data", "batch_independence"),
    (
        "causality",
        "a sequence model that sees the future: a causal mask missing",
        "causality",
        "causality",
    ),
    ("activations", "dead or saturated units", "activations", "activations"),
    ("weight-norms", "weights growing without bound", "gradients", "weight_norms"),
    ("update-ratio", "updates that do nothing or blow up", "gradients", "update_ratio"),
    ("memorize", "a training loop that cannot learn at all", "training", "memorize_check"),
    (
        "input-dependence",
        "outputs that ignore the inputs: posterior collapse, an input path cut",
        "dependence",
        "input_dependence",
    ),
    ("lr-range", "a learning rate orders of magnitude off", "lr", "lr_range"),
    ("label-alignment", "labels misaligned with inputs", "labels", "label_alignment"),
    (
        "leakage",
        "a score too good to be true: split overlap, a leaked feature",
        "leakage",
        "leakage",
    ),
    ("reproducibility", "runs that cannot be compared", "repro", "reproducibility"),
)


def _registry() -> list[Check]:
    """The checks of the ladder, their functions imported."""
    return [
        Check(check_id, catches, getattr(importlib.import_module(f"dlci.checks.{module}"), name))
        for check_id, catches, module, name in LADDER
    ]


def select(only: str | None) -> list[Check]:
    """The checks to run, in ladder order; ``only`` is a comma-separated list of IDs."""
    checks = _registry()
    if not only:
        return checks
    wanted = [part.strip() for part in only.split(",") if part.strip()]
    unknown = [w for w in wanted if w not in CHECK_IDS]
    if unknown:
        raise DlciError(
            f"--only: unknown check {unknown[0]!r}",
            hint=suggest(unknown[0], list(CHECK_IDS), "checks"),
        )
    return [c for c in checks if c.id in wanted]


def run_checks(
    target: Target,
    *,
    checks: list[Check] | None = None,
    tier: Tier | None = None,
    device: str | None = None,
    stop_on_fail: bool = False,
    on_result: Callable[[CheckResult], None] | None = None,
    factory: Callable[[], Target] | None = None,
    crashes: list[BaseException] | None = None,
    policy: Policy | None = None,
    today: dt.date | None = None,
    context: Context | None = None,
) -> list[CheckResult]:
    """Run the checks in order, each leaving the model and random state as it found them.

    A check that raises without the target's code on the stack crashed: its result says so
    (status ``crashed``, never a failure the target earned) and the exception is appended to
    ``crashes``, for the caller to report as dl-ci's own error once the other checks ran.
    ``policy`` holds the project's thresholds, which the checks read, and its waivers: a
    ``skip`` waiver keeps its check from running, a ``warn-only`` one turns its failure into
    a warning (a crash stays a crash); a waiver past its ``until`` (``today`` by default the
    date of the run) no longer applies.
    """
    checks = checks if checks is not None else _registry()
    policy = policy or Policy()
    batch_size = getattr(tier, "batch_size", 16)
    try:  # ``context``: one already built (script mode's, on the script's objects)
        ctx = context or Context.build(
            target, batch_size=batch_size, device=device, tier=tier, factory=factory, policy=policy
        )
    except (DlciError, SystemExit) as exc:  # no batch at all: still a report, check by check
        unbuilt = _without_a_batch(checks, exc)
        for result in unbuilt:
            if on_result is not None:
                on_result(result)
        return unbuilt
    results: list[CheckResult] = []
    stopped = False
    for check in checks:
        waiver = policy.waiver(check.id)
        if waiver is not None and waiver.expired(today):
            waiver = None  # it stopped working: the check runs and counts as usual
        if stopped:
            result = CheckResult(check.id, SKIP, cause="--stop-on-fail: an earlier check failed")
        elif waiver is not None and waiver.mode == SKIP_WAIVER:
            result = _skipped(check.id, waiver)
        elif check.run is None:
            result = CheckResult(check.id, SKIP, cause="not available in this version of dl-ci yet")
        else:
            result = _run_one(check, ctx, crashes)
            if waiver is not None and waiver.mode == WARN_ONLY:
                _warn_only(result, waiver)
        results.append(result)
        if on_result is not None:
            on_result(result)
        stopped = stopped or (stop_on_fail and result.status in (FAIL, CRASHED))
    cascade.attribute(results)
    return results


def _without_a_batch(checks: list[Check], exc: BaseException) -> list[CheckResult]:
    """The results when the target gives no batch to check (its loader raised or exited):
    the first check fails with the error, located, and every other one says it could not
    run and why, so the report lists the whole ladder."""
    if not checks:
        return []
    if isinstance(exc, SystemExit):
        error = exited(exc, "the train_loader")
        message, hint, location = error.message, "", ""
    else:
        assert isinstance(exc, DlciError)
        message, hint, location = exc.message, exc.hint or "", exc.location or ""
    first = CheckResult(
        checks[0].id,
        FAIL,
        message[:2000],
        "a batch of the training data to check",
        cause="the target gave no batch to check: its train_loader's first batch could not be "
        "read, or not used, before any check ran" + (f" (at {location})" if location else ""),
        fix="run 'dlci memorize' on the target: it shows where the error is",
        details={"frames": hint[-8000:]},
    )
    rest = [
        CheckResult(
            check.id,
            SKIP,
            cause=f"could not run: the target gave no batch to check (see {checks[0].id})",
        )
        for check in checks[1:]
    ]
    return [first, *rest]


def _run_one(check: Check, ctx: Context, crashes: list[BaseException] | None) -> CheckResult:
    """One check, timed, its exceptions sorted: the target's fault, or dl-ci's crash."""
    assert check.run is not None
    start = time.perf_counter()
    with preserved(ctx.target):
        try:
            result = check.run(ctx)
        except (TargetExited, UserCodeError) as exc:  # the target's code, inside a
            result = _failed_in_target(check.id, exc)  # check that ran it (memorize)
        except DlciError as exc:  # the target is not what this check needs: its result, and
            result = _mistake(check.id, exc)  # the other checks still run (a report, always)
        except SystemExit as exc:  # an exit in the target's code: no verdict, a failure
            result = _exited(check.id, exc)
        except TargetFault as exc:  # the target's code gave back something unusable
            result = _raised(check.id, exc)
        except Exception as exc:
            if raised_by_dlci(exc) or not _in_target(exc):
                result = _crashed(check.id, exc)  # dl-ci's bug, or torch under it
                if crashes is not None:
                    crashes.append(exc)
            else:
                result = _raised(check.id, exc)  # the target's own code failed
    result.seconds = round(time.perf_counter() - start, 3)
    return result


def _waived(waiver: Waiver, status: str | None) -> dict[str, Any]:
    """What a check's result says of the waiver applied to it."""
    entry = waiver.to_json()
    return {
        "mode": entry["mode"],
        "reason": entry["reason"],
        "until": entry["until"],
        "source": entry["source"],
        "status_without_waiver": status,
    }


def _skipped(check_id: str, waiver: Waiver) -> CheckResult:
    """A check the project waived with ``skip``: not run, the reason in its place."""
    until = f" (until {waiver.until.isoformat()})" if waiver.until else ""
    where_ = f" at {waiver.source}" if waiver.source else ""
    return CheckResult(
        check_id,
        SKIP,
        cause=f"waived: {waiver.reason}{until}",
        fix=f"remove the waiver{where_} to run the check again",
        waived=_waived(waiver, None),
    )


def _warn_only(result: CheckResult, waiver: Waiver) -> None:
    """A ``warn-only`` waiver: a failure reads as a warning; a crash stays a crash (it is
    no verdict on the target, so there is nothing to waive)."""
    before = result.status
    if before == FAIL:
        result.status = WARN
    result.waived = _waived(waiver, before)


def _in_target(exc: BaseException) -> bool:
    """Whether the target's code was running when ``exc`` was raised: a frame of its own
    files, or a frame of one of its objects (a model or loss module, its optimizer, its data
    set or loader), which covers a model built only of torch's own modules."""
    import torch
    from torch.utils.data import DataLoader, Dataset

    owners = (torch.nn.Module, torch.optim.Optimizer, Dataset, DataLoader)
    tb = exc.__traceback__
    while tb is not None:
        frame = tb.tb_frame
        if not is_dlci(frame.f_code.co_filename) and not is_library(frame.f_code.co_filename):
            return True
        owner = frame.f_locals.get("self")
        if isinstance(owner, owners) or type(owner).__name__.endswith("DataLoaderIter"):
            return True
        tb = tb.tb_next
    return False


def _crashed(check_id: str, exc: BaseException) -> CheckResult:
    ours = raised_by_dlci(exc)
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return CheckResult(
        check_id,
        CRASHED,
        f"{type(exc).__name__}: {exc}"[:500],
        "the check runs to its end",
        cause=(
            "the check crashed: a bug in dl-ci"
            if ours
            else f"the check crashed at {where(user_frame(frames(exc.__traceback__)))}, "
            "with no frame of the target's code on the stack"
        )
        + "; this is no finding about the target",
        fix="report it to dl-ci with details.traceback; the other checks' results stand",
        details={"traceback": text[-8000:]},
    )


def _exited(check_id: str, exc: SystemExit) -> CheckResult:
    error = exited(exc, f"the {check_id} check")
    return CheckResult(
        check_id,
        FAIL,
        "the process was asked to exit",
        "the check runs to its end",
        cause=error.message,
        fix="remove the exit from the target's code (raise an exception instead)",
    )


def _failed_in_target(check_id: str, exc: DlciError) -> CheckResult:
    where_ = f" at {exc.location}" if exc.location else ""
    return CheckResult(
        check_id,
        FAIL,
        exc.message,
        "the check runs",
        cause=f"the target's code failed during this check{where_}",
        fix="run 'dlci memorize' on the target: it shows where the error is",
        details={"frames": exc.hint or ""},
    )


def _mistake(check_id: str, exc: DlciError) -> CheckResult:
    """A located mistake that stopped one check (the outputs carry no loss, a batch that
    cannot be split): that check fails with the message and hint; the ladder goes on."""
    return CheckResult(
        check_id,
        FAIL,
        exc.message,
        "the check runs",
        cause="the target is not what this check needs",
        fix=exc.hint or "see docs/target.md",
        details={"location": exc.location or ""},
    )


def _raised(check_id: str, exc: Exception) -> CheckResult:
    summaries = frames(exc.__traceback__)
    return CheckResult(
        check_id,
        FAIL,
        f"{type(exc).__name__}: {exc}",
        "the check runs",
        cause=f"the target's code raised an error during this check, at "
        f"{where(user_frame(summaries))}",
        fix="run 'dlci memorize' on the target: it shows where the error is",
        details={"frames": frames_text(summaries)},
    )
