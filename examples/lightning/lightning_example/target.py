"""What dl-ci trains: the LightningModule and its DataModule, through Target.from_lightning."""

from __future__ import annotations

from torch import nn

import dlci
from lightning_example.data import DigitsDataModule
from lightning_example.model import DigitsClassifier, ManualDigitsClassifier


def make_target(lr: float = 3e-3) -> dlci.Target:
    """The example as dl-ci sees it: the module's own training_step and configure_optimizers.

    >>> target = make_target()
    >>> type(target.model).__name__, target.num_classes
    ('DigitsClassifier', 10)
    """
    # loss_fn scores the forward's outputs for the checks that look at held-out data;
    # training itself runs training_step
    return dlci.Target.from_lightning(
        DigitsClassifier(lr=lr), DigitsDataModule(), loss_fn=nn.CrossEntropyLoss()
    )


def make_manual_target() -> dlci.Target:
    """The manual-optimisation module: self.optimizers(), self.manual_backward."""
    return dlci.Target.from_lightning(
        ManualDigitsClassifier(), DigitsDataModule(), loss_fn=nn.CrossEntropyLoss()
    )
