"""The memorization gate passes only a loss that fell from its start (issue 28).

A zoo of task shapes (memorize_zoo.py) runs through the real engine at the default ladder's
CPU tiers: each healthy shape passes the PR tier; each variant that cannot learn (a step
that never calls ``optimizer.step()``, lr 0, lr 1e-9) fails every budget with a reason that
says the loss did not fall from its start. The control: for half the shapes the start is
already below the old absolute threshold 1.0, so a gate without the start rule passes them.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

import dlci
import memorize_zoo as zoo
from dlci.errors import DlciError
from dlci.ladder.goal import Goal
from dlci.ladder.load import load_ladder, load_ladder_text, select_tier
from dlci.memorization.engine import Distributed, MemorizeConfig, memorize
from dlci.memorization.verdict import judge

LADDER = load_ladder()
TIERS = {b: select_tier(LADDER, budget=b, hardware_class="cpu") for b in ("pr", "merge", "nightly")}


def _config(budget: str) -> MemorizeConfig:
    return MemorizeConfig.from_tier(TIERS[budget], device="cpu")


@pytest.fixture(scope="module")
def pr_runs() -> dict[tuple[str, str], dlci.MemorizeResult]:
    """One real PR-tier run per shape and variant, read by every test below."""
    return {
        (shape, variant): memorize(zoo.target(shape, variant), _config("pr"))
        for shape in zoo.SHAPES
        for variant in ("healthy", *zoo.VARIANTS)
    }


@pytest.mark.parametrize("shape", zoo.SHAPES)
def test_every_healthy_shape_passes_the_pr_tier_on_the_cpu(pr_runs, shape) -> None:
    result = pr_runs[(shape, "healthy")]
    assert result.passed, result.reason
    assert result.steps >= 2
    assert result.relative_loss is not None and result.relative_loss <= 0.3
    assert "of its start" in result.reason


@pytest.mark.parametrize("variant", zoo.VARIANTS)
@pytest.mark.parametrize("shape", zoo.SHAPES)
def test_a_model_that_cannot_learn_fails_every_budget(pr_runs, shape, variant) -> None:
    result = pr_runs[(shape, variant)]
    assert not result.passed
    assert result.reason.startswith("the loss did not fall from its start: from ")
    assert "dlci doctor --target" in result.next_step and "optimizer-coverage" in result.next_step
    # the loss never moved, so more epochs cannot help: the longer budgets judge the same curve
    start = result.losses[0]
    assert all(abs(v - start) <= 1e-5 * abs(start) for v in result.losses)
    for budget in ("merge", "nightly"):
        config = _config(budget)
        verdict = judge(
            config,
            losses=result.losses,
            best=min(result.losses),
            best_step=1,
            stopped_by="epochs",
            wall=0.0,
            setup=0.0,
            device="cpu",
            dist=Distributed(),
            examples=16,
            changes=[],
            hparams={},
            goal=Goal(config.max_loss, config.max_relative_loss, zoo.target(shape).loss_floor),
        )
        assert verdict.verdict == "fail", (budget, verdict.reason)


def test_the_control_an_absolute_threshold_alone_passes_frozen_models(pr_runs) -> None:
    """Without the start rule, FSDL's absolute 1.0 passes these frozen models at step 1."""
    below = [s for s in zoo.SHAPES if pr_runs[(s, "frozen")].losses[0] < 1.0]
    assert {"binary", "multilabel", "mse-small"} <= set(below)
    absolute_only = dataclasses.replace(_config("pr"), max_loss=1.0, max_relative_loss=None)
    for shape in below:  # the built-in rule alone still refuses them
        assert not memorize(zoo.target(shape, "frozen"), absolute_only).passed


def test_a_pass_never_comes_at_step_1() -> None:
    goal = Goal(max_loss=1.0, max_relative_loss=None)
    assert not goal.met(0.01, 0.01, 1)
    assert goal.met(2.0, 0.5, 2)
    assert not goal.met(2.0, 1.2, 2)  # 60% of its start: it barely moved


class _Offset(torch.nn.Module):
    """A loss that is its one weight: 0.5, then -0.5 after one SGD step of lr 1."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.tensor(0.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w + 0 * x.sum()


def _offset_target(floor: float | None) -> dlci.Target:
    data = torch.utils.data.TensorDataset(torch.zeros(16, 1), torch.zeros(16))
    return dlci.Target(
        model=_Offset(),
        optimizer=lambda params: torch.optim.SGD(params, lr=1.0),
        train_loader=torch.utils.data.DataLoader(data, batch_size=16),
        loss_fn=lambda out, _y: out,
        loss_floor=floor,
    )


def test_a_loss_below_zero_without_a_floor_cannot_be_judged_and_fails() -> None:
    result = memorize(_offset_target(None), _config("pr"))
    assert not result.passed
    assert (result.stopped_by, result.steps) == ("unjudged", 2)
    assert "the loss went below 0 (-0.5) and the target declares no floor" in result.reason
    assert "loss_floor" in result.next_step
    # the control: with its floor declared, the same loss is judged (-0.5 is 0% above -0.5 from
    # a start 1.0 above it, after falling)
    judged = memorize(_offset_target(-1.0), _config("pr"))
    assert judged.stopped_by != "unjudged"


def test_a_floor_must_be_a_finite_number() -> None:
    good = zoo.target("binary")
    with pytest.raises(DlciError, match="loss_floor must be a finite number or a function of"):
        dlci.Target(
            good.model, good.optimizer, good.train_loader, good.loss_fn, loss_floor=math.nan
        )


ROW = "{max_epochs: 10, time_cap_minutes: 1, profile_steps: 1, nproc: 1"


def _ladder(version: int, row: str, extends: bool = False) -> str:
    head = f"version: {version}\n" + ("extends: default\n" if extends else "")
    if extends:
        return head + f"budgets:\n  pr:\n    cpu: {ROW}, {row}}}\n"
    body = "".join(f"  {b}:\n    cpu: {ROW}, {row}}}\n" for b in ("pr", "merge", "nightly"))
    return head + "classes:\n  cpu: {match: [], speed: 0.02}\nbudgets:\n" + body


def test_a_version_2_row_may_state_either_threshold_or_both() -> None:
    for row, rel, absolute in [
        ("max_relative_loss: 0.1", 0.1, None),
        ("max_loss: 0.5", None, 0.5),
        ("max_loss: 0.5, max_relative_loss: 0.1", 0.1, 0.5),
    ]:
        tier = select_tier(load_ladder_text(_ladder(2, row)), budget="pr", hardware_class="cpu")
        assert (tier.max_relative_loss, tier.max_loss) == (rel, absolute)


@pytest.mark.parametrize(
    ("version", "row", "message"),
    [
        (
            2,
            "batch_size: 16",
            "budgets.pr.cpu: missing required key 'max_loss' or 'max_relative_loss'",
        ),
        (
            1,
            "max_relative_loss: 0.1",
            "budgets.pr.cpu.max_relative_loss: max_relative_loss needs ladder version 2",
        ),
        (
            2,
            "max_relative_loss: 0.6",
            "budgets.pr.cpu.max_relative_loss: must be at most 0.5, got 0.6",
        ),
        (
            3,
            "max_loss: 1",
            "version: unsupported ladder version 3; this dl-ci reads versions 1 and 2",
        ),
    ],
)
def test_a_row_without_a_usable_threshold_is_a_located_error(version, row, message) -> None:
    with pytest.raises(DlciError) as caught:
        load_ladder_text(_ladder(version, row))
    assert message in str(caught.value)


def test_a_version_1_ladder_over_the_default_keeps_its_rows_absolute_and_says_so() -> None:
    ladder = load_ladder_text(_ladder(1, "max_loss: 0.5", extends=True), "mine.yaml")
    mine = select_tier(ladder, budget="pr", hardware_class="cpu")
    inherited = select_tier(ladder, budget="nightly", hardware_class="cpu")
    assert (mine.max_loss, mine.max_relative_loss) == (0.5, None)
    assert (inherited.max_loss, inherited.max_relative_loss) == (None, 0.02)
    assert any(
        "mine.yaml is a version 1 ladder" in w and "budgets.pr.cpu" in w for w in mine.warnings
    )
