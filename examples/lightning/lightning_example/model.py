"""A small CNN for 8x8 digits as a LightningModule: automatic optimisation with a scheduler,
and the same network trained with manual optimisation."""

from __future__ import annotations

import lightning as L
import torch
from torch import nn
from torch.nn import functional as F

Batch = tuple[torch.Tensor, torch.Tensor]  # (images, labels)


def small_cnn(num_classes: int = 10, dropout: float = 0.25) -> nn.Sequential:
    """Two convolutions, a pooling layer and a two-layer head, with dropout.

    >>> small_cnn()(torch.zeros(4, 1, 8, 8)).shape
    torch.Size([4, 10])
    """
    return nn.Sequential(
        nn.Conv2d(1, 16, kernel_size=3, padding=1),
        nn.ReLU(),
        nn.Conv2d(16, 32, kernel_size=3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Dropout(dropout),
        nn.Linear(32 * 4 * 4, 64),
        nn.ReLU(),
        nn.Dropout(dropout),
        nn.Linear(64, num_classes),
    )


class DigitsClassifier(L.LightningModule):
    """The classifier, trained the usual Lightning way: training_step returns the loss."""

    def __init__(self, num_classes: int = 10, lr: float = 3e-3, max_epochs: int = 20) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = small_cnn(num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: Batch, batch_idx: int) -> torch.Tensor:
        images, labels = batch
        loss = F.cross_entropy(self(images), labels)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch: Batch, batch_idx: int) -> None:
        images, labels = batch
        logits = self(images)
        self.log("val_loss", F.cross_entropy(logits, labels))
        self.log("val_acc", (logits.argmax(dim=1) == labels).float().mean())

    def configure_optimizers(self) -> dict[str, object]:
        optimizer = torch.optim.AdamW(self.parameters(), lr=self.hparams.lr, weight_decay=1e-2)
        schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, self.hparams.max_epochs)
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": schedule, "interval": "epoch"},
        }


class ManualDigitsClassifier(DigitsClassifier):
    """The same classifier with manual optimisation: the step zeroes, back-propagates and steps."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.automatic_optimization = False

    def training_step(self, batch: Batch, batch_idx: int) -> torch.Tensor:
        optimizer = self.optimizers()
        images, labels = batch
        loss = F.cross_entropy(self(images), labels)
        optimizer.zero_grad()
        self.manual_backward(loss)
        optimizer.step()
        self.log("train_loss", loss)
        return loss
