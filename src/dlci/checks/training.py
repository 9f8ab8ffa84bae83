"""memorize: the memorization test as the first rung of the ladder."""

from __future__ import annotations

from dlci.checks.base import FAIL, PASS, SKIP, CheckResult, Context


def memorize_check(ctx: Context) -> CheckResult:
    from dlci.memorization.engine import MemorizeConfig, memorize

    if ctx.tier is None:
        return CheckResult("memorize", SKIP, cause="no tier selected")
    config = MemorizeConfig.from_tier(ctx.tier, device=str(ctx.device))
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
    return CheckResult(
        "memorize",
        FAIL,
        result.reason,
        expected,
        cause="the training loop cannot overfit one small batch, so it cannot learn",
        fix="see the checks above; then the learning rate (lr-range) and the loss",
        details={
            "best_loss": result.best_loss,
            "start_loss": result.start_loss,
            "relative_loss": result.relative_loss,
            "steps": result.steps,
        },
    )
