"""Helpers for users' own tests.

import dlci
from mypkg.train import make_target

@pytest.mark.memorization
def test_the_model_can_memorize_one_batch(dlci_tier):
    dlci.assert_memorizes(make_target(), tier=dlci_tier)
"""

from __future__ import annotations

from dlci.ladder.load import Tier
from dlci.ladder.plan import session_plan
from dlci.ladder.tiers import choose_tier
from dlci.memorization.engine import MemorizeConfig, MemorizeResult, memorize
from dlci.training.target import Target


def assert_memorizes(
    target: Target, tier: Tier | None = None, *, seed: int = 0, device: str | None = None
) -> MemorizeResult:
    """Fail the test unless ``target`` memorizes one batch within ``tier``.

    ``tier`` defaults to the one ``dlci tier`` selects here (budget and hardware auto), or
    under ``dlci run`` to the job plan's (the pytest plugin's ``--dlci-plan``).
    Returns the result, so a test can check more (``result.steps``, ``result.best_loss``).
    """
    if tier is None:
        tier = choose_tier(plan=session_plan())
    # a mistake, or an exit in the target (TargetExited), is a DlciError: it fails this test with
    # its message and pytest goes on (a SystemExit of the target's would have ended the session)
    result = memorize(target, MemorizeConfig.from_tier(tier, seed=seed, device=device))
    if not result.passed:
        raise AssertionError(_message(result, tier))
    return result


def _message(result: MemorizeResult, tier: Tier) -> str:
    tail = result.losses[-5:]
    lines = [
        f"memorization failed at tier {tier.budget}/{tier.hardware_class}: {result.reason}",
        "last losses: " + ", ".join(f"{v:.4g}" for v in tail),
        "A loop that cannot overfit 16 examples cannot learn: check the learning rate, that the "
        "loss is computed on the model's output, and that gradients reach every layer "
        "(dlci doctor runs those checks).",
    ]
    if result.next_step:
        lines.append(f"next: {result.next_step}")
    return "\n".join(lines)
