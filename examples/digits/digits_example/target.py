"""What dl-ci trains: ``make_target`` returns the model, optimizer and data as a dlci.Target."""

from __future__ import annotations

import torch
from torch import nn

import dlci
from digits_example.data import NUM_CLASSES, loaders
from digits_example.model import SmallCNN


def make_target(lr: float = 3e-3) -> dlci.Target:
    """The example as dl-ci sees it.

    >>> target = make_target()
    >>> type(target.model).__name__, target.num_classes
    ('SmallCNN', 10)
    """
    train_loader, val_loader = loaders()
    return dlci.Target(
        SmallCNN(NUM_CLASSES),
        lambda params: torch.optim.AdamW(params, lr=lr, weight_decay=1e-2),
        train_loader,
        loss_fn=nn.CrossEntropyLoss(),
        val_loader=val_loader,
        num_classes=NUM_CLASSES,
    )
