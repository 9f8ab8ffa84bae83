"""scikit-learn's digits (1,797 8x8 images, shipped inside the package) as a LightningDataModule."""

from __future__ import annotations

import lightning as L
import torch
from sklearn.datasets import load_digits
from torch.utils.data import DataLoader, TensorDataset

NUM_CLASSES = 10


class DigitsDataModule(L.LightningDataModule):
    """A seeded train/validation split of the digits, as (N, 1, 8, 8) images in [0, 1].

    >>> data = DigitsDataModule()
    >>> data.setup("fit")
    >>> images, labels = next(iter(data.train_dataloader()))
    >>> tuple(images.shape), labels.dtype, len(data.val_set)
    ((32, 1, 8, 8), torch.int64, 360)
    """

    def __init__(self, batch_size: int = 32, val_fraction: float = 0.2, seed: int = 0) -> None:
        super().__init__()
        self.batch_size = batch_size
        self.val_fraction = val_fraction
        self.seed = seed
        self.num_classes = NUM_CLASSES

    def setup(self, stage: str) -> None:
        digits = load_digits()
        images = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
        labels = torch.tensor(digits.target, dtype=torch.long)
        order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(self.seed))
        cut = int(len(labels) * (1 - self.val_fraction))
        train, val = order[:cut], order[cut:]
        self.train_set = TensorDataset(images[train], labels[train])
        self.val_set = TensorDataset(images[val], labels[val])

    def train_dataloader(self) -> DataLoader:
        shuffle = torch.Generator().manual_seed(self.seed)
        return DataLoader(
            self.train_set, batch_size=self.batch_size, shuffle=True, generator=shuffle
        )

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=self.batch_size)
