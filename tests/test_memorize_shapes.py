"""A healthy model never fails the memorization gate; one that cannot learn never passes
(issue 43).

The zoo (floor_zoo.py) holds models of the shapes real projects train: losses whose floor is
above 0 (label smoothing, distillation, mixup, InfoNCE), below 0 (Poisson counts), random
steps (a VAE, a DDPM step, a re-masked LM), slow learners (a transformer at AdamW 5e-5, SGD at
0.01) and a CTC model that starts far above its label priors. One real run per shape and twin
at the default ladder's CPU tiers, read by every test below; each protection has its control:
the same curve judged without it gives the wrong verdict.
"""

from __future__ import annotations

import dataclasses
import math

import pytest

import dlci
import floor_zoo as zoo
from dlci.ladder.goal import Goal
from dlci.ladder.load import load_ladder, select_tier
from dlci.memorization import engine
from dlci.memorization.engine import Distributed, MemorizeConfig, memorize
from dlci.memorization.verdict import judge

LADDER = load_ladder()
TIERS = {b: select_tier(LADDER, budget=b, hardware_class="cpu") for b in ("pr", "nightly")}
CASES = [(shape, twin) for shape in zoo.SHAPES for twin in ("healthy", *zoo.TWINS[shape])]


def _config(budget: str) -> MemorizeConfig:
    return MemorizeConfig.from_tier(TIERS[budget], device="cpu")


@pytest.fixture(scope="module")
def runs() -> dict[tuple[str, str, str], dlci.MemorizeResult]:
    """The PR tier for every case; the nightly tier for the healthy ones (a twin's run stops
    early, flat or on its plateau, before either tier's epochs: its verdict at night is
    judged from the same curve below)."""
    done = {
        (shape, twin, "pr"): memorize(zoo.target(shape, twin), _config("pr"))
        for shape, twin in CASES
    }
    for shape in zoo.SHAPES:
        done[(shape, "healthy", "nightly")] = memorize(zoo.target(shape), _config("nightly"))
    return done


def _rejudge(result: dlci.MemorizeResult, budget: str, goal: Goal) -> dlci.MemorizeResult:
    config = _config(budget)
    return judge(
        config,
        losses=result.losses,
        best=result.best_loss,
        best_step=result.best_step,
        stopped_by=result.stopped_by if result.stopped_by != "threshold" else "epochs",
        wall=0.0,
        setup=0.0,
        device="cpu",
        dist=Distributed(),
        examples=result.batch_examples,
        changes=[],
        hparams={},
        goal=dataclasses.replace(goal, max_relative_loss=config.max_relative_loss),
    )


def _goal(result: dlci.MemorizeResult, **changes: object) -> Goal:
    goal = Goal(None, None, result.loss_floor if result.floor_source != "assumed" else None)
    goal = dataclasses.replace(goal, blind=result.blind_loss)
    return dataclasses.replace(goal, **changes)


@pytest.mark.parametrize("budget", ["pr", "nightly"])
@pytest.mark.parametrize("shape", zoo.SHAPES)
def test_every_healthy_shape_passes_the_pr_and_nightly_tiers_on_the_cpu(
    runs, shape, budget
) -> None:
    result = runs[(shape, "healthy", budget)]
    assert result.passed, result.reason
    assert result.draws_replayed and result.judged_on.startswith("the median of the last 3")
    assert result.relative_loss is not None
    assert result.relative_loss <= TIERS[budget].max_relative_loss


@pytest.mark.parametrize(("shape", "twin"), [c for c in CASES if c[1] != "healthy"])
def test_every_twin_fails_every_tier_naming_the_baseline_it_did_not_beat(runs, shape, twin) -> None:
    result = runs[(shape, twin, "pr")]
    assert not result.passed
    assert result.stopped_by in ("flat", "plateau"), result.reason  # long before the epochs end
    if result.case == "blind":
        assert "not below the input-blind baseline" in result.reason
        assert "inputs reach the model" in result.next_step
    else:
        assert result.case == "flat", result.reason
        assert result.reason.startswith("the loss did not fall from its start: from ")
        assert "so more epochs cannot help" in result.reason
    # the longer budget judges the same curve: a flattened curve does not pass at night
    assert not _rejudge(result, "nightly", _goal(result)).passed


def test_the_floors_and_baselines_are_measured_on_the_batch(runs) -> None:
    smoothing = runs[("label-smoothing", "healthy", "pr")]
    # CrossEntropyLoss(label_smoothing=0.1) over 10 classes: 0.9 ln(1/0.91) + 0.1 * 9 * ... = 0.50
    assert smoothing.floor_source == "measured" and smoothing.loss_floor == pytest.approx(
        0.500, abs=2e-3
    )
    poisson = runs[("poisson", "healthy", "pr")]
    assert poisson.loss_floor is not None and poisson.loss_floor < -5  # counts around 8: below 0
    ctc = runs[("ctc", "healthy", "pr")]
    # the model's log-softmax is kept: a free log-probability above 0 would put CTC below 0
    assert 0 <= ctc.loss_floor < 0.05
    assert any("log-probabilities" in line for line in ctc.measured)
    assert ctc.blind_loss is not None and ctc.blind_loss < 0.5 * ctc.start_loss
    diffusion = runs[("diffusion", "healthy", "pr")]  # a train_step of its own: not separable
    assert diffusion.floor_source == "assumed" and diffusion.blind_loss is None


def test_the_control_a_floor_assumed_0_fails_the_healthy_shapes_whose_floor_is_above_it(
    runs,
) -> None:
    for shape in ("label-smoothing", "distillation", "mixup", "infonce"):
        result = runs[(shape, "healthy", "nightly")]
        assert result.loss_floor > 0.3, shape
        assert not _rejudge(result, "nightly", _goal(result, floor=None, blind=None)).passed, shape


def test_the_control_without_the_baseline_the_blind_twins_pass(runs) -> None:
    """A CTC model fed zeros falls from a uniform start to its label priors: to 26% of its
    start, far enough to pass the PR tier against its start alone."""
    blind = runs[("ctc", "blind", "pr")]
    assert blind.case == "blind"
    assert _rejudge(blind, "pr", _goal(blind, blind=None)).passed


def test_random_forwards_are_replayed_and_the_control_without_replay_moves_at_lr_0(
    runs, monkeypatch
) -> None:
    vae = runs[("vae", "healthy", "pr")]
    assert any(line.startswith("the forward is random by design") for line in vae.measured)
    # a DDPM step at lr 0 on replayed draws: the same loss at every step
    still = runs[("diffusion", "lr0", "pr")]
    assert len(set(still.losses)) == 1
    monkeypatch.setattr(engine.Draws, "replay", lambda self: None)
    moving = memorize(
        zoo.target("diffusion", "lr0"), dataclasses.replace(_config("pr"), max_epochs=30)
    )
    assert len(set(moving.losses)) > 10 and moving.stopped_by != "flat"
    assert max(moving.losses) > 1.3 * min(moving.losses)  # one lucky draw is far below the rest


def test_attention_dropout_is_off_and_the_control_shows_it_on(runs, monkeypatch) -> None:
    result = runs[("finetune-5e-5", "healthy", "pr")]
    assert any("self_attn (MultiheadAttention).dropout (0.1 -> 0)" in c for c in result.changes)
    assert (
        "dropout off, confirmed: two train-mode forward passes on fresh draws agree"
        in result.measured
    )
    from dlci.training import regularization

    monkeypatch.setattr(regularization, "_zero_floats", lambda *args: None)
    on = memorize(
        zoo.target("finetune-5e-5", "lr0"), dataclasses.replace(_config("pr"), max_epochs=3)
    )
    assert not any("MultiheadAttention" in c for c in on.changes)
    assert any(line.startswith("the forward is random by design") for line in on.measured)


def test_a_slow_learner_cut_short_says_it_was_still_falling_and_when_it_would_arrive(runs) -> None:
    healthy = runs[("finetune-5e-5", "healthy", "pr")]
    short = dataclasses.replace(_config("pr"), max_epochs=150)
    verdict = judge(
        short,
        losses=healthy.losses[:150],
        best=min(healthy.losses[:150]),
        best_step=1,
        stopped_by="epochs",
        wall=0.0,
        setup=0.0,
        device="cpu",
        dist=Distributed(),
        examples=16,
        changes=[],
        hparams={},
        goal=_goal(healthy, max_relative_loss=short.max_relative_loss),
    )
    assert (verdict.verdict, verdict.case) == ("fail", "still-falling"), verdict.reason
    assert verdict.projected_epochs is not None
    # the projection from the first 150 epochs lands within a factor of 2 of the real step
    assert healthy.steps / 2 <= verdict.projected_epochs <= 2 * healthy.steps
    assert "dlci calibrate --target" in verdict.next_step
    assert "dlci doctor" not in verdict.next_step


def test_a_floor_declared_as_a_function_of_the_batch_is_used_as_declared() -> None:
    target = zoo.target("diffusion")
    target.loss_floor = lambda batch: 0.01 * float(batch[0].shape[0] > 0)
    result = memorize(target, _config("pr"))
    assert (result.floor_source, result.loss_floor) == ("declared", 0.01)
    assert "floor 0.01 (declared by the target)" in " ".join(result.measured)
    assert result.passed and math.isfinite(result.relative_loss)
