"""lr-range: an exponential learning-rate sweep, judged against the configured rate.

Lightning and fastai suggest a rate from the steepest slope of the smoothed loss; their users
find the suggestion noisy (Lightning #1767, #2814). dl-ci differentiates against log10(lr),
which is what the sweep is linear in, and gives a verdict on the rate you configured rather
than a suggestion to copy.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

from dlci.checks.base import FAIL, PASS, SKIP, WARN, CheckResult, Context, number

START, END, STEPS, BETA, DIVERGE, SKIP_FIRST, WINDOW = 1e-7, 10.0, 100, 0.98, 4.0, 10, 5


def lr_range(ctx: Context) -> CheckResult:
    optimizer = ctx.optimizer()
    configured = float(optimizer.param_groups[0].get("lr", 0.0) or 0.0)
    if configured <= 0:
        return CheckResult("lr-range", SKIP, cause="the optimizer has no positive 'lr'")
    scales = [float(g.get("lr", configured)) / configured for g in optimizer.param_groups]
    batches = _batches(ctx)
    lrs, losses = _sweep(ctx, optimizer, scales, batches)
    if len(losses) <= SKIP_FIRST + 2:
        return CheckResult(
            "lr-range",
            FAIL,
            f"the loss diverged by lr {lrs[-1] if lrs else START:.1e}",
            "a sweep of 1e-7..10",
            cause="training diverges at every rate tried",
            fix="check the loss and the data for inf/NaN; try a smaller model scale",
        )
    steepest, lowest = _steepest_and_lowest(lrs, losses)
    low, high = steepest / 100, lowest
    details = {
        "configured": configured,
        "steepest": steepest,
        "lowest_loss_lr": lowest,
        "lrs": [round(v, 12) for v in lrs],
        "smoothed_loss": [round(v, 6) for v in losses],
    }
    measured = (
        f"configured {configured:.1e}; steepest descent at {steepest:.1e}, "
        f"lowest loss at {lowest:.1e}"
    )
    factors = (
        ctx.policy.threshold("lr-range", "fail-above"),
        ctx.policy.threshold("lr-range", "fail-below"),
    )
    return _verdict(configured, steepest, (low, high, *factors), measured, details)


def _steepest_and_lowest(lrs: list[float], losses: list[float]) -> tuple[float, float]:
    """The rate where the smoothed loss falls fastest against log10(lr), and where it is lowest."""
    logs = [math.log10(lr) for lr in lrs]
    # the slope over half a decade each side: single-batch noise would otherwise pick the
    # steepest point at random (the complaint about Lightning's suggestion)
    w = WINDOW
    points = range(max(SKIP_FIRST, w), len(losses) - w)
    if not points:
        points = range(1, len(losses) - 1)
        w = 1
    slope = {i: (losses[i + w] - losses[i - w]) / (logs[i + w] - logs[i - w]) for i in points}
    steep_i = min(slope, key=lambda i: slope[i])
    best_i = min(range(SKIP_FIRST, len(losses)), key=lambda i: losses[i])
    return lrs[steep_i], lrs[best_i]


def _verdict(
    configured: float,
    steepest: float,
    bounds: tuple[float, float, float, float],
    measured: str,
    details: dict[str, Any],
) -> CheckResult:
    """Fail two orders of magnitude outside ``bounds`` (one above), warn just outside (by
    default: the project's lr-range.fail-above and fail-below set the factors)."""
    low, high, above, below = bounds
    expected = (
        f"between {low:.1e} and {high:.1e} (fails over {number(above)}x above or "
        f"{number(below)}x below)"
    )
    if configured > above * high or configured < low / below:
        too = "high" if configured > high else "low"
        return CheckResult(
            "lr-range",
            FAIL,
            measured,
            expected,
            details=details,
            cause=f"the learning rate is orders of magnitude too {too}",
            fix=f"try about {steepest:.0e} (the steepest descent of the sweep)",
        )
    if configured > high or configured < low:
        return CheckResult(
            "lr-range",
            WARN,
            measured,
            expected,
            details=details,
            cause="the learning rate is outside the range where the loss falls fastest",
            fix=f"try about {steepest:.0e}",
        )
    return CheckResult("lr-range", PASS, measured, expected, details=details)


def _batches(ctx: Context) -> list[Any]:
    return ctx.loader_batches(ctx.target.train_loader, STEPS) or [ctx.batch]


def _diverged(value: float, best: float, first: float) -> bool:
    """Above DIVERGE times the best loss; a loss that reaches zero or goes negative (a
    Gaussian NLL, a hinge) is measured by the same span above its best, on the scale of
    the first loss."""
    span = best if best > 0 else max(abs(best), abs(first))
    return value > best + (DIVERGE - 1) * span


def _sweep(
    ctx: Context, optimizer: Any, scales: list[float], batches: list[Any]
) -> tuple[list[float], list[float]]:
    ctx.model.train()
    lrs: list[float] = []
    smoothed: list[float] = []
    average, best = 0.0, math.inf
    factor = (END / START) ** (1 / (STEPS - 1))
    for step, batch in zip(range(STEPS), itertools.cycle(batches), strict=False):
        lr = START * factor**step
        for group, scale in zip(optimizer.param_groups, scales, strict=True):
            group["lr"] = lr * scale
        loss = ctx.step(ctx.model, optimizer, batch)
        if not math.isfinite(loss):
            break
        average = BETA * average + (1 - BETA) * loss
        value = average / (1 - BETA ** (step + 1))
        lrs.append(lr)
        smoothed.append(value)
        best = min(best, value)
        if step >= SKIP_FIRST and _diverged(value, best, smoothed[0]):  # early: mostly noise
            break
    return lrs, smoothed
