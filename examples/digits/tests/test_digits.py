"""The example's own tests, as a user of dl-ci would write them."""

from __future__ import annotations

import pytest
import torch

import dlci
from digits_example.broken import make_detached_target, make_tiny_lr_target
from digits_example.data import digits_tensors, loaders
from digits_example.target import make_target
from dlci.errors import DlciError


def test_batches_are_images_and_labels() -> None:
    train, _ = loaders(batch_size=32)
    images, labels = next(iter(train))
    assert images.shape == (32, 1, 8, 8)
    assert labels.dtype == torch.long


def test_every_class_is_present() -> None:
    _, labels = digits_tensors()
    assert set(labels.tolist()) == set(range(10))


@pytest.mark.memorization
def test_the_model_memorizes_one_batch(dlci_tier) -> None:
    result = dlci.assert_memorizes(make_target(), tier=dlci_tier)
    assert result.relative_loss <= dlci_tier.max_relative_loss


@pytest.mark.memorization(target="digits_example.target:make_target")
def test_the_target_from_the_marker_memorizes(dlci_target, dlci_tier) -> None:
    dlci.assert_memorizes(dlci_target, tier=dlci_tier)


@pytest.mark.memorization
def test_a_learning_rate_far_too_small_is_caught(dlci_tier) -> None:
    with pytest.raises(AssertionError, match="the loss did not fall from its start"):
        dlci.assert_memorizes(make_tiny_lr_target(), tier=dlci_tier)


@pytest.mark.memorization
def test_a_detached_output_is_caught(dlci_tier) -> None:
    with pytest.raises(DlciError, match="output is detached"):
        dlci.assert_memorizes(make_detached_target(), tier=dlci_tier)
