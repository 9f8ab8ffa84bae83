"""Targets that misbehave where the Target contract lets them, for tests/test_user_gates.py.

``DLCI_HOSTILE=PLACE:ACTION`` chooses the misbehaviour, read at each call:
PLACE is import, factory, train_loader, train_step, loss_fn or eval_step; ACTION is exit0
(``sys.exit(0)``), os_exit0 (``os._exit(0)``), raise (``ValueError``) or hang (sleeps for
ever, from the third call on, so the run has losses before it sticks).
"""

from __future__ import annotations

import os
import sys
import time
from collections import Counter

import torch
from torch import nn

import dlci

CALLS: Counter[str] = Counter()


def misbehave(place: str) -> None:
    wanted, _, action = os.environ.get("DLCI_HOSTILE", "").partition(":")
    if wanted != place:
        return
    CALLS[place] += 1
    if action == "exit0":
        sys.exit(0)
    if action == "os_exit0":
        os._exit(0)
    if action == "raise":
        raise ValueError(f"hostile {place}")
    if action == "hang" and CALLS[place] >= 3:
        while True:
            time.sleep(0.05)


misbehave("import")


class Loader:
    """One (inputs, targets) batch of 16 examples, two classes."""

    def __init__(self) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(16, 4, generator=g)
        self.y = (self.x[:, 0] > 0).long()

    def __iter__(self):
        misbehave("train_loader")
        yield self.x, self.y


def loss_fn(outputs, targets):
    misbehave("loss_fn")
    return nn.functional.cross_entropy(outputs, targets)


def train_step(model, batch, optimizer):
    misbehave("train_step")
    optimizer.zero_grad()
    loss = nn.functional.cross_entropy(model(batch[0]), batch[1])
    loss.backward()
    optimizer.step()
    return loss


def eval_step(model, batch):
    misbehave("eval_step")
    model.eval()
    return model(batch[0])


def _target(**steps) -> dlci.Target:
    misbehave("factory")
    return dlci.Target(
        nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.1), nn.Linear(8, 2)),
        lambda params: torch.optim.SGD(params, lr=0.5),
        Loader(),
        loss_fn=loss_fn,
        num_classes=2,
        **steps,
    )


def make_target() -> dlci.Target:
    """The target's own train_step and eval_step."""
    return _target(train_step=train_step, eval_step=eval_step)


def make_plain_target() -> dlci.Target:
    """dl-ci's standard step, so loss_fn is called."""
    return _target()
