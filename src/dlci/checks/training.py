"""memorize: the memorization test as the first rung of the ladder.

The gate (``dlci memorize``) judges the tier's epochs and nothing more. The doctor asks why:
a loss still falling steadily when the tier's epochs ran out has not shown that the loop
cannot learn. The gate's verdict projects, from the curve's last third, the epoch at which the
goal would be reached (memorization/curve.py); within EXTEND_FACTOR times the tier's epochs
that is a warning (the loop learns, too slowly for the tier: the gate fails it), not a
failure. The projection is counted in steps, so the verdict is the same on a loaded machine
and an idle one.
"""

from __future__ import annotations

from typing import Any

from dlci.checks.base import FAIL, PASS, SKIP, WARN, CheckResult, Context, preserved
from dlci.memorization.engine import MemorizeConfig, memorize

EXTEND_FACTOR = 4  # a projection within this many times the tier's epochs: learns, slowly


def memorize_check(ctx: Context) -> CheckResult:
    if ctx.tier is None:
        return CheckResult("memorize", SKIP, cause="no tier selected")
    config = MemorizeConfig.from_tier(ctx.tier, device=str(ctx.device))
    with preserved(ctx.target):  # later rungs start where this one did: weights, RNG, data
        result = memorize(ctx.target, config)
    ctx.shared["memorize"] = result.passed  # later rungs judge only a loop that can learn
    expected = f"{result.criterion or ctx.tier.criterion} within {ctx.tier.max_epochs} epochs"
    if result.passed:
        share = result.relative_loss if result.relative_loss is not None else float("nan")
        return CheckResult(
            "memorize",
            PASS,
            f"loss {result.start_loss:.3g} -> {result.final_loss:.3g} ({share:.2%} of its "
            f"reference) at step {result.steps}",
            expected,
        )
    details: dict[str, Any] = {
        "best_loss": result.best_loss,
        "start_loss": result.start_loss,
        "relative_loss": result.relative_loss,
        "steps": result.steps,
        "case": result.case,
        "loss_floor": result.loss_floor,
        "floor_source": result.floor_source,
        "blind_loss": result.blind_loss,
    }
    projected = result.projected_epochs
    if result.case == "still-falling" and projected is not None:
        details["projected_epochs"] = projected
        if projected <= EXTEND_FACTOR * config.max_epochs:
            ctx.shared["memorize"] = True  # the loop learns: later rungs may judge it
            return CheckResult(
                "memorize",
                WARN,
                result.reason,
                expected,
                cause=f"the loop learns, too slowly for the tier: at its pace it reaches the "
                f"goal near epoch {projected} where the tier gives {config.max_epochs}, so the "
                "memorize gate fails it (a learning rate low for this budget, or a model slow "
                "to fit)",
                fix="raise the learning rate (see lr-range's steepest rate), or size the ladder "
                "to this model with dlci calibrate (docs/calibration.md)",
                details=details,
            )
    return CheckResult(
        "memorize",
        FAIL,
        result.reason,
        expected,
        cause=_cause(result.case, config.max_epochs, projected),
        fix=result.next_step or "see the checks above; then the learning rate and the loss",
        details=details,
    )


def _cause(case: str, epochs: int, projected: int | None) -> str:
    if case == "blind":
        return (
            "the loss fell only as far as a model that ignores its inputs can: the outputs "
            "do not depend on the inputs (an input path cut, inputs zeroed, posterior collapse)"
        )
    if case == "still-falling":
        pace = f"near epoch {projected}" if projected is not None else "far past"
        return (
            f"the loss was still falling when the tier's {epochs} epochs ran out, and at its "
            f"pace it reaches the goal {pace}, over {EXTEND_FACTOR} times the tier: the loop "
            "learns far too slowly to overfit one small batch"
        )
    if case == "noisy":
        return (
            "the loss jumps between steps on the same batch and draws: the verdict rests on draws"
        )
    return "the training loop cannot overfit one small batch, so it cannot learn"
