"""The example's own tests, as a user of dl-ci with Transformers would write them."""

from __future__ import annotations

import pytest

import dlci
from dlci.checks import run_checks, select
from transformers_example.broken import make_shifted_labels_target
from transformers_example.target import make_target, make_trainer_target


@pytest.mark.memorization
def test_the_model_memorizes_one_batch(dlci_tier) -> None:
    result = dlci.assert_memorizes(make_target(), tier=dlci_tier)
    assert result.relative_loss <= dlci_tier.max_relative_loss


@pytest.mark.memorization(target="transformers_example.target:make_trainer_target")
def test_the_trainer_memorizes_one_batch(dlci_target, dlci_tier) -> None:
    dlci.assert_memorizes(dlci_target, tier=dlci_tier)


def test_a_collator_that_shifts_labels_is_caught() -> None:
    [result] = run_checks(make_shifted_labels_target(), checks=select("label-alignment"))
    assert result.status == "fail", result
    [control] = run_checks(make_trainer_target(), checks=select("label-alignment"))
    assert control.status == "pass", control
