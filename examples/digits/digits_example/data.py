"""scikit-learn's digits (1,797 8x8 images, shipped inside the package) as torch data."""

from __future__ import annotations

import torch
from sklearn.datasets import load_digits
from torch.utils.data import DataLoader, TensorDataset

NUM_CLASSES = 10


def digits_tensors() -> tuple[torch.Tensor, torch.Tensor]:
    """Images scaled to [0, 1] as (N, 1, 8, 8) floats, and labels as (N,) longs.

    >>> x, y = digits_tensors()
    >>> tuple(x.shape), tuple(y.shape), float(x.max()), int(y.max())
    ((1797, 1, 8, 8), (1797,), 1.0, 9)
    """
    digits = load_digits()
    images = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    return images, torch.tensor(digits.target, dtype=torch.long)


def split(val_fraction: float = 0.2, seed: int = 0) -> tuple[TensorDataset, TensorDataset]:
    """A seeded train/validation split.

    >>> train, val = split()
    >>> len(train), len(val)
    (1437, 360)
    """
    images, labels = digits_tensors()
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(seed))
    cut = int(len(labels) * (1 - val_fraction))
    train, val = order[:cut], order[cut:]
    return TensorDataset(images[train], labels[train]), TensorDataset(images[val], labels[val])


def loaders(batch_size: int = 64, seed: int = 0) -> tuple[DataLoader, DataLoader]:
    """Shuffled training batches and ordered validation batches."""
    train, val = split(seed=seed)
    shuffle = torch.Generator().manual_seed(seed)
    return (
        DataLoader(train, batch_size=batch_size, shuffle=True, generator=shuffle),
        DataLoader(val, batch_size=batch_size),
    )
