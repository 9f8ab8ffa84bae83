"""The example's own tests, as a user of dl-ci with Lightning would write them."""

from __future__ import annotations

import pytest

import dlci
from dlci.checks import run_checks, select
from dlci.errors import DlciError
from lightning_example.broken import make_detached_target, make_no_zero_grad_target
from lightning_example.target import make_manual_target, make_target


@pytest.mark.memorization
def test_the_module_memorizes_one_batch(dlci_tier) -> None:
    result = dlci.assert_memorizes(make_target(), tier=dlci_tier)
    assert result.relative_loss <= dlci_tier.max_relative_loss


@pytest.mark.memorization
def test_the_manual_optimisation_module_memorizes_one_batch(dlci_tier) -> None:
    dlci.assert_memorizes(make_manual_target(), tier=dlci_tier)


@pytest.mark.memorization(target="lightning_example.target:make_target")
def test_the_target_from_the_marker_memorizes(dlci_target, dlci_tier) -> None:
    dlci.assert_memorizes(dlci_target, tier=dlci_tier)


@pytest.mark.memorization
def test_a_detached_training_step_is_caught(dlci_tier) -> None:
    with pytest.raises(DlciError, match="output is detached"):
        dlci.assert_memorizes(make_detached_target(), tier=dlci_tier)


def test_a_manual_step_without_zero_grad_is_caught() -> None:
    [result] = run_checks(make_no_zero_grad_target(), checks=select("zero-grad"))
    assert result.status == "fail", result
    [control] = run_checks(make_manual_target(), checks=select("zero-grad"))
    assert control.status == "pass", control
