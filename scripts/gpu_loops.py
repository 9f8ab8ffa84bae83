"""Three training loops with known behaviour, profiled by scripts/gpu_acceptance.sh.

Each function returns a ``dlci.Target``, so ``dlci profile --target gpu_loops:healthy`` runs it
(the script puts this folder on ``PYTHONPATH``). On a GPU the model is large enough for its
kernels to set the pace (about 100 GFLOP a step); on the CPU path it is tiny, so the smoke test
stays fast. What each loop should show in ``dlci analyze``:

- ``healthy``: the data is in memory, nothing waits; the GPU is busy most of each step.
- ``slow_loader``: every example takes time to "decode" in the main process, so the GPU waits
  for data: low utilization and a data-loading recommendation.
- ``item_every_step``: ``loss.item()`` in every step, a device-to-host sync that stalls the
  host until the GPU has finished: one sync (at least) per step in the sync inventory.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from torch import nn

import dlci

CLASSES = 10


def _sizes() -> tuple[int, int, int, int]:
    """(features, width, batch, batches): GPU-bound on a GPU, tiny on the CPU path."""
    if torch.cuda.is_available():
        return 256, 4096, 512, 8
    return 32, 64, 8, 8


def _model() -> nn.Module:
    features, width, _, _ = _sizes()
    return nn.Sequential(
        nn.Linear(features, width),
        nn.ReLU(),
        nn.Linear(width, width),
        nn.ReLU(),
        nn.Linear(width, width),
        nn.ReLU(),
        nn.Linear(width, CLASSES),
    )


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    features, _, batch, batches = _sizes()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(batch * batches, features, generator=g)
    y = torch.randint(0, CLASSES, (batch * batches,), generator=g)
    return x, y


def _target(loader: Any) -> dlci.Target:
    return dlci.Target(
        _model(),
        lambda p: torch.optim.SGD(p, lr=0.01),
        loader,
        loss_fn=nn.CrossEntropyLoss(),
    )


class _SlowDataset(torch.utils.data.Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Each example takes a while to "decode", in the main process (no workers)."""

    def __init__(self, seconds_per_example: float) -> None:
        self.x, self.y = _data()
        self.seconds = seconds_per_example

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(self.seconds)
        return self.x[i], self.y[i]


def healthy() -> dlci.Target:
    _, _, batch, _ = _sizes()
    x, y = _data()
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(x, y), batch_size=batch, pin_memory=torch.cuda.is_available()
    )
    return _target(loader)


def slow_loader() -> dlci.Target:
    # 512 examples x 0.2 ms = about 100 ms of loading a step on a GPU, against ~2 ms of compute
    _, _, batch, _ = _sizes()
    seconds = 0.0002 if torch.cuda.is_available() else 0.005
    return _target(torch.utils.data.DataLoader(_SlowDataset(seconds), batch_size=batch))


def item_every_step() -> dlci.Target:
    """The healthy loop with a ``train_step`` that logs ``loss.item()`` every step."""
    target = healthy()
    losses: list[float] = []

    def train_step(model: nn.Module, batch: Any, optimizer: Any) -> torch.Tensor:
        inputs, labels = batch
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(inputs), labels)
        loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()
        losses.append(loss.item())  # the sync under test
        return loss

    target.train_step = train_step
    return target
