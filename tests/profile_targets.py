"""Training loops with known performance bugs, for ``dlci profile`` on real CPU traces."""

from __future__ import annotations

import time

import torch
from torch import nn

import dlci


class _SlowDataset(torch.utils.data.Dataset):
    """Each example takes 5 ms to "decode": the loader, not the model, sets the pace."""

    def __init__(self, n: int = 64) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 32, generator=g)
        self.y = torch.randint(0, 4, (n,), generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        time.sleep(0.005)
        return self.x[i], self.y[i]


def _model() -> nn.Module:
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))


def slow_loader() -> dlci.Target:
    loader = torch.utils.data.DataLoader(_SlowDataset(), batch_size=8)
    return dlci.Target(
        _model(), lambda p: torch.optim.SGD(p, lr=0.1), loader, loss_fn=nn.CrossEntropyLoss()
    )


def healthy() -> dlci.Target:
    data = torch.utils.data.TensorDataset(torch.randn(64, 32), torch.randint(0, 4, (64,)))
    loader = torch.utils.data.DataLoader(data, batch_size=8)
    return dlci.Target(
        _model(), lambda p: torch.optim.SGD(p, lr=0.1), loader, loss_fn=nn.CrossEntropyLoss()
    )


def item_every_step() -> dlci.Target:
    """A train_step that logs ``loss.item()`` every step (a sync on a GPU)."""
    target = healthy()
    losses: list[float] = []

    def train_step(model, batch, optimizer):
        inputs, targets = batch
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(inputs), targets)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        return loss

    target.train_step = train_step
    return target


def fails_at_step_three() -> dlci.Target:
    """A train_step that raises on its third call, after the profiler has started."""
    target = healthy()
    calls: list[int] = []

    def train_step(model, batch, optimizer):
        calls.append(1)
        if len(calls) == 3:
            raise ValueError("shapes do not match")
        inputs, targets = batch
        loss = nn.functional.cross_entropy(model(inputs), targets)
        loss.backward()
        return loss

    target.train_step = train_step
    return target
