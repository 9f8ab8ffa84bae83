"""Deliberately broken variants of the example, each a bug in the user's own Lightning code.

dl-ci runs the module's real training_step, so each bug is caught by the gate that looks for
it: the memorization test for a detached output, the zero-grad check for a manual step that
never zeroes its gradients.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

import dlci
from lightning_example.data import DigitsDataModule
from lightning_example.model import Batch, DigitsClassifier, ManualDigitsClassifier


class DetachedClassifier(DigitsClassifier):
    """The bug: training_step returns the loss of a detached output."""

    def training_step(self, batch: Batch, batch_idx: int) -> torch.Tensor:
        images, labels = batch
        return F.cross_entropy(self(images).detach(), labels)


class NoZeroGradClassifier(ManualDigitsClassifier):
    """The bug: a manual step that never calls optimizer.zero_grad()."""

    def training_step(self, batch: Batch, batch_idx: int) -> torch.Tensor:
        optimizer = self.optimizers()
        images, labels = batch
        loss = F.cross_entropy(self(images), labels)
        self.manual_backward(loss)
        optimizer.step()
        return loss


def make_detached_target() -> dlci.Target:
    """No gradient reaches any weight: the memorization test fails with the cause."""
    return dlci.Target.from_lightning(DetachedClassifier(), DigitsDataModule())


def make_no_zero_grad_target() -> dlci.Target:
    """Gradients accumulate across steps: the zero-grad check fails."""
    return dlci.Target.from_lightning(
        NoZeroGradClassifier(), DigitsDataModule(), loss_fn=nn.CrossEntropyLoss()
    )
