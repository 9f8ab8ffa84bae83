"""The memorization engine, on real (small) torch training on the CPU."""

from __future__ import annotations

import math
import time

import pytest
import torch
from torch import nn

from dlci.errors import DlciError
from dlci.ladder.goal import percent, smoothed
from dlci.memorization.engine import MemorizeConfig, memorize, seed_everything
from dlci.memorization.verdict import training_time
from dlci.training.target import Target

PR = MemorizeConfig(max_epochs=100, max_loss=0.5, time_cap_s=60)


def blobs(n: int = 32, classes: int = 4) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(0)
    return [
        (
            torch.randn(n, 10, generator=generator),
            torch.randint(0, classes, (n,), generator=generator),
        )
    ]


def mlp_target(
    lr: float = 0.05, dropout: float = 0.0, weight_decay: float = 0.0, **kwargs
) -> Target:
    seed_everything(0)
    model = nn.Sequential(nn.Linear(10, 64), nn.ReLU(), nn.Dropout(dropout), nn.Linear(64, 4))
    return Target(
        model,
        lambda params: torch.optim.Adam(params, lr=lr, weight_decay=weight_decay),
        blobs(),
        loss_fn=nn.CrossEntropyLoss(),
        **kwargs,
    )


def test_it_passes_and_stops_as_soon_as_the_threshold_is_reached() -> None:
    result = memorize(mlp_target(), PR)
    assert result.passed
    assert result.stopped_by == "threshold"
    assert result.steps < PR.max_epochs
    # judged on the median of the last steps: the first step whose median is below the goal
    judged = [smoothed(result.losses[: i + 1]) for i in range(result.steps)]
    assert judged[-1] < 0.5 <= min(judged[:-1])
    assert result.reason.startswith(
        f"loss {result.losses[0]:.4g} -> {result.losses[-1]:.4g} at step {result.steps}, "
    )
    assert "(memorised means loss < 0.5 and at or below 50% of its start" in result.reason
    assert result.judged_on.startswith("the median of the last 3 losses")
    assert result.reason.endswith(training_time(result.wall_time_s, result.setup_time_s))
    assert " of training (" in result.reason and " with the set-up of batch, model" in result.reason


def test_the_reason_states_the_times_the_report_keeps() -> None:
    """The reason's times come from the rounded times the report keeps: a wall time of
    3.49996 ms once read "3 ms" in the reason and 0.0035 s (4 ms) in the report."""
    from types import SimpleNamespace

    from dlci.memorization.verdict import judge

    result = judge(
        PR,
        losses=[1.0, 0.2],
        best=0.2,
        best_step=2,
        stopped_by="threshold",
        wall=0.00349996,
        setup=0.0020001,
        device="cpu",
        dist=SimpleNamespace(world_size=1),
        examples=32,
        changes=[],
        hparams={},
    )
    assert result.reason.endswith(training_time(result.wall_time_s, result.setup_time_s))
    assert "in 4 ms of training" in result.reason


def test_without_early_stop_it_runs_every_epoch_and_gives_the_same_verdict() -> None:
    full = memorize(
        mlp_target(), MemorizeConfig(max_epochs=100, max_loss=0.5, time_cap_s=60, early_stop=False)
    )
    assert (full.passed, full.steps) == (True, 100)
    assert full.best_loss == min(full.losses)


def test_it_fails_when_the_loss_never_reaches_the_threshold() -> None:
    result = memorize(
        mlp_target(lr=0.0), MemorizeConfig(max_epochs=20, max_loss=0.5, time_cap_s=60)
    )
    assert (result.verdict, result.stopped_by, result.steps) == ("fail", "epochs", 20)
    start = result.losses[0]
    # four classes of blobs: what the label priors alone reach is below a uniform start
    assert result.blind_loss is not None and result.blind_loss < start
    share = (start - result.loss_floor) / (result.blind_loss - result.loss_floor)
    assert result.reason == (
        f"the loss did not fall from its start: from {start:.4g} at step 1 to at best "
        f"{start:.4g} at step 2 ({percent(share)} of the input-blind baseline), in 20 epochs; "
        f"memorised means loss < 0.5 and at or below 50% of its start (above the floor "
        f"{result.loss_floor:.4g}) and of the input-blind baseline {result.blind_loss:.4g}"
    )
    assert result.next_step.startswith("run dlci doctor --target <your target>; ")


def test_a_nan_loss_fails_at_once_naming_the_step() -> None:
    calls = {"n": 0}
    base = nn.CrossEntropyLoss()

    def loss_fn(outputs, targets):
        # the training steps' calls (the model's Linear made the outputs), not the floor's
        calls["n"] += type(outputs.grad_fn).__name__ == "AddmmBackward0"
        loss = base(outputs, targets)
        return loss * float("nan") if calls["n"] == 4 else loss

    target = mlp_target()
    target.loss_fn = loss_fn
    result = memorize(target, PR)
    assert (result.verdict, result.stopped_by, result.steps) == ("fail", "nonfinite", 4)
    assert result.reason.startswith("the loss is nan at step 4 (best ")
    assert result.to_dict()["final_loss"] == "nan"


def test_the_time_cap_stops_a_slow_loop_with_the_best_loss() -> None:
    target = mlp_target(lr=1e-6)
    standard = nn.CrossEntropyLoss()

    def slow_step(model, batch, optimizer):
        time.sleep(0.05)
        optimizer.zero_grad()
        loss = standard(model(batch[0]), batch[1])
        loss.backward()
        optimizer.step()
        return loss

    target.train_step = slow_step
    result = memorize(target, MemorizeConfig(max_epochs=1000, max_loss=0.01, time_cap_s=0.3))
    assert (result.verdict, result.stopped_by) == ("fail", "time")
    assert 1 <= result.steps < 20  # 50 ms a step against a 0.3 s cap, on a loaded machine too
    assert result.reason.startswith(
        f"time cap of 0.005 min reached at step {result.steps} of 1000; the loss "
    )


def test_the_users_own_train_step_is_what_runs() -> None:
    seen: list[bool] = []
    target = mlp_target()
    standard = nn.CrossEntropyLoss()

    def train_step(model, batch, optimizer):
        seen.append(model.training)
        optimizer.zero_grad()
        loss = standard(model(batch[0]), batch[1])
        loss.backward()
        optimizer.step()
        return loss.item()  # a float is accepted too

    target.train_step = train_step
    result = memorize(target, PR)
    assert result.passed
    assert len(seen) == result.steps
    assert all(seen)


def test_dropout_and_weight_decay_are_switched_off_and_reported() -> None:
    result = memorize(mlp_target(dropout=0.5, weight_decay=0.1), PR)
    assert result.changes == [
        "dropout off: 2 (Dropout, p=0.5 -> 0)",
        "weight decay off: param group 0 (0.1 -> 0)",
    ]
    assert result.hparams["weight_decay"] == 0.1  # recorded as the user configured it
    assert result.hparams["optimizer"] == "Adam"


def test_two_runs_with_the_same_seed_give_the_same_losses() -> None:
    first = memorize(mlp_target(), PR).losses
    assert memorize(mlp_target(), PR).losses == first


def test_the_global_determinism_settings_are_restored() -> None:
    before = torch.are_deterministic_algorithms_enabled()
    memorize(mlp_target(), PR)
    assert torch.are_deterministic_algorithms_enabled() == before


def test_a_detached_output_is_explained() -> None:
    target = mlp_target()
    inner = target.model
    target.model = nn.Sequential(inner)
    target.model.forward = lambda x: inner(x).detach()
    with pytest.raises(DlciError) as info:
        memorize(target, PR)
    assert info.value.message == "step 1: the loss has no gradient"
    assert "output is detached from its parameters" in (info.value.hint or "")


def test_a_loss_that_is_not_a_scalar_is_explained() -> None:
    target = mlp_target()
    target.loss_fn = nn.CrossEntropyLoss(reduction="none")
    with pytest.raises(DlciError) as info:
        memorize(target, PR)
    assert info.value.message == "step 1: the loss has shape (16,), not a single value"


def test_an_error_in_the_users_model_is_a_user_error_with_its_location() -> None:
    target = mlp_target()
    target.model = nn.Linear(3, 4)  # wrong input size
    with pytest.raises(DlciError) as info:
        memorize(target, PR)
    # the forward is first run before step 1, to confirm that dropout is off
    assert info.value.message.startswith("the model raised RuntimeError: mat1 and mat2 shapes")


def test_frozen_parameters_are_explained() -> None:
    target = mlp_target()
    for parameter in target.model.parameters():
        parameter.requires_grad_(False)
    with pytest.raises(DlciError, match="the model has no trainable parameters"):
        memorize(target, PR)


def test_the_report_dict_is_json_safe() -> None:
    data = memorize(mlp_target(), PR).to_dict()
    assert all(isinstance(v, float) and math.isfinite(v) for v in data["losses"])
    assert data["world_size"] == 1
