"""The floor and the input-blind baseline on shapes a held-out review found wrong (issue 43):
sigmoid outputs under BCELoss, outputs in a dataclass, a loss that returns a float, a drop
path whose rate is ``p``. Each search is a few hundred evaluations of a small loss: no
training."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

from dlci.errors import DlciError
from dlci.memorization import floor
from dlci.memorization.engine import MemorizeConfig, memorize
from dlci.training.regularization import switch_off_regularization
from dlci.training.target import Target

N = 16


def _pixels() -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    return (torch.rand(N, 32, generator=g) * 1.4 - 0.2).clamp(0, 1)  # many exactly 0 or 1


def _measure(loss_fn, outputs, targets) -> floor.References:
    return floor.measure(loss_fn, outputs, targets, N, lambda: None)


def test_sigmoid_outputs_under_bce_reach_the_same_floor_as_logits(monkeypatch) -> None:
    targets = _pixels()
    logits = torch.randn(N, 32, generator=torch.Generator().manual_seed(1)) * 0.1
    on_logits = _measure(nn.BCEWithLogitsLoss(), logits, targets)
    on_probabilities = _measure(nn.BCELoss(), logits.sigmoid(), targets)
    assert on_probabilities.floor == pytest.approx(on_logits.floor, abs=5e-3)
    assert any("values in [0, 1]" in note for note in on_probabilities.notes)
    # the control: searched as free values, the refused steps past 1 stall it above the floor
    monkeypatch.setattr(floor, "_bounded", lambda kind, *args: kind)
    stalled = _measure(nn.BCELoss(), logits.sigmoid(), targets)
    assert stalled.floor is None or stalled.floor > on_logits.floor + 0.02


@dataclasses.dataclass
class _Out:
    logits: torch.Tensor
    note: str = "kept"


def test_outputs_in_a_dataclass_are_set_free() -> None:
    labels = torch.tensor([0] * 12 + [1] * 4)
    result = _measure(
        lambda out, y: nn.functional.cross_entropy(out.logits, y), _Out(torch.zeros(N, 2)), labels
    )
    assert result.floor_source == "measured" and result.floor < 1e-3
    # the label priors (12 of 16 in one class): what a model that ignores its inputs reaches
    assert result.blind == pytest.approx(0.5623, abs=1e-3)


def test_a_blind_baseline_at_the_floor_is_said() -> None:
    result = _measure(nn.MSELoss(), torch.randn(N, 3), torch.zeros(N, 3))  # targets all alike
    assert any("the input-blind baseline reaches the floor" in note for note in result.notes)


def test_a_loss_that_returns_a_float_is_a_user_error_not_a_crash() -> None:
    data = [(torch.randn(N, 4), torch.randint(0, 2, (N,)))]
    target = Target(
        nn.Linear(4, 2),
        lambda params: torch.optim.SGD(params, lr=0.1),
        data,
        loss_fn=lambda out, y: nn.functional.cross_entropy(out, y).item(),
    )
    config = MemorizeConfig(max_epochs=5, max_loss=None, max_relative_loss=0.3, time_cap_s=60)
    with pytest.raises(DlciError, match="loss_fn returned a float, not a tensor"):
        memorize(target, config)


class DropPath(nn.Module):
    """Stochastic depth as projects write it by hand: its rate in ``p``."""

    def __init__(self, p: float) -> None:
        super().__init__()
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0:
            return x
        keep = torch.rand(x.shape[0], 1) >= self.p
        return x * keep / (1 - self.p)


def test_a_drop_path_of_its_own_is_switched_off_and_put_back() -> None:
    model = nn.Sequential(nn.Linear(4, 4), DropPath(0.2), nn.Linear(4, 2))
    model.norm_p = 0.5  # a float named p elsewhere is no dropout rate: left alone
    switched = switch_off_regularization(model, torch.optim.SGD(model.parameters(), lr=0.1))
    assert switched.changes == ["dropout off: 1 (DropPath).p (0.2 -> 0)"]
    assert model[1].p == 0.0
    switched.restore()
    assert model[1].p == 0.2
