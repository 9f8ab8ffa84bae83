"""memorize: the memorization test as the first rung of the ladder.

The gate (``dlci memorize``) judges the tier's epochs and nothing more. The doctor asks why:
a loss still falling when the tier's epochs ran out has not shown that the loop cannot learn,
so, when affordable, the same test runs on for EXTEND_FACTOR times the epochs. A pass then is
a warning (the loop learns, too slowly for the tier: the gate fails it), not a failure.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from dlci.checks.base import FAIL, PASS, SKIP, WARN, CheckResult, Context, preserved

EXTEND_FACTOR = 4  # the epochs of the longer run, in tiers
EXTEND_SECONDS = 30.0  # the longer run takes place when projected within this
STILL_FALLING = 0.02  # the last tenth of the run lowered the best loss by this share of the start


def memorize_check(ctx: Context) -> CheckResult:
    from dlci.memorization.engine import MemorizeConfig, memorize

    if ctx.tier is None:
        return CheckResult("memorize", SKIP, cause="no tier selected")
    config = MemorizeConfig.from_tier(ctx.tier, device=str(ctx.device))
    with preserved(ctx.target):  # a longer run starts where this one did: weights, RNG, data
        result = memorize(ctx.target, config)
    ctx.shared["memorize"] = result.passed  # later rungs judge only a loop that can learn
    expected = f"{result.criterion or ctx.tier.criterion} within {ctx.tier.max_epochs} epochs"
    if result.passed:
        share = result.relative_loss if result.relative_loss is not None else float("nan")
        return CheckResult(
            "memorize",
            PASS,
            f"loss {result.start_loss:.3g} -> {result.final_loss:.3g} ({share:.2%} of its "
            f"start) at step {result.steps}",
            expected,
        )
    details: dict[str, Any] = {
        "best_loss": result.best_loss,
        "start_loss": result.start_loss,
        "relative_loss": result.relative_loss,
        "steps": result.steps,
    }
    cause = "the training loop cannot overfit one small batch, so it cannot learn"
    if result.stopped_by == "epochs" and _still_falling(result.losses):
        projected = result.wall_time_s * EXTEND_FACTOR
        longer_epochs = config.max_epochs * EXTEND_FACTOR
        if projected <= EXTEND_SECONDS:
            longer = memorize(ctx.target, replace(config, max_epochs=longer_epochs))
            details["extended"] = {
                "epochs": longer_epochs,
                "passed": longer.passed,
                "steps": longer.steps,
                "best_loss": longer.best_loss,
            }
            if longer.passed:
                ctx.shared["memorize"] = True  # the loop learns: later rungs may judge it
                return CheckResult(
                    "memorize",
                    WARN,
                    f"{result.reason}; run on, it reached the goal at step {longer.steps}",
                    expected,
                    cause=f"the loop learns, too slowly for the tier: it needs {longer.steps} "
                    f"epochs where the tier gives {config.max_epochs}, so the memorize gate "
                    "fails it (a learning rate low for this budget, or a model slow to fit)",
                    fix="raise the learning rate (see lr-range's steepest rate), or give the "
                    "tier more epochs in the ladder (docs/budget-ladder.md)",
                    details=details,
                )
            cause = (
                f"the loss was still falling when the tier's {config.max_epochs} epochs ran "
                f"out, and {longer_epochs} epochs did not reach the goal either: the loop "
                "learns far too slowly to overfit one small batch"
            )
        else:
            cause = (
                f"the loss was still falling when the tier's {config.max_epochs} epochs ran "
                f"out (running {EXTEND_FACTOR} times as long would take about {projected:.0f} "
                f"s, over the check's {EXTEND_SECONDS:.0f} s): too slow to overfit one small "
                "batch in this tier; a learning rate far too low, or a loop that cannot learn"
            )
    return CheckResult(
        "memorize",
        FAIL,
        result.reason,
        expected,
        cause=cause,
        fix="see the checks above; then the learning rate (lr-range) and the loss",
        details=details,
    )


def _still_falling(losses: list[float]) -> bool:
    """Whether the last tenth of the run lowered the best loss by STILL_FALLING of the start:
    a curve still going down, not one that flattened out above the goal."""
    import math

    if len(losses) < 20 or not all(math.isfinite(v) for v in losses):
        return False
    tail = max(len(losses) // 10, 2)
    before, after = min(losses[:-tail]), min(losses[-tail:])
    start = losses[0]
    return start > 0 and (before - after) >= STILL_FALLING * abs(start)
