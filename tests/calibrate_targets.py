"""Small real targets for dlci calibrate's tests: a fast healthy one, and ones that fail in
one seed's run (raise, exit), ignore the seed, or leave a sabotaged variant nothing to change.

The data are fixed (their own generator); the initial weights follow the global seed, as
they do in most projects, so each seed's run differs.
"""

from __future__ import annotations

import os

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import dlci

FAIL_SEED_VARIABLE = "CALIBRATE_TEST_FAIL_SEED"  # the seed whose run raises (unset: none)


def _data() -> DataLoader:
    g = torch.Generator().manual_seed(7)
    labels = torch.randint(0, 4, (64,), generator=g)
    inputs = torch.randn(4, 10, generator=g)[labels] + 0.5 * torch.randn(64, 10, generator=g)
    return DataLoader(TensorDataset(inputs, labels), batch_size=16)


def tiny() -> dlci.Target:
    """An MLP on 16 examples of 4 blobs: a healthy target whose runs take a few milliseconds."""
    model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 4))
    return dlci.Target(
        model, lambda p: torch.optim.Adam(p, lr=1e-2), _data(), loss_fn=nn.CrossEntropyLoss()
    )


def fails_on_a_seed() -> dlci.Target:
    """``tiny``, whose factory raises in the run of the seed named by the variable."""
    if os.environ.get(FAIL_SEED_VARIABLE) == str(torch.initial_seed()):
        raise ValueError(f"a planted failure in seed {torch.initial_seed()}")
    return tiny()


def exits_on_seed_1() -> dlci.Target:
    """``tiny``, whose factory ends the process in seed 1's run, as a crash would."""
    if torch.initial_seed() == 1:
        os._exit(7)
    return tiny()


def sys_exit_on_seed_1() -> dlci.Target:
    if torch.initial_seed() == 1:
        raise SystemExit(0)
    return tiny()


def ignores_the_seed() -> dlci.Target:
    """``tiny`` seeded inside its factory: every seed gives the same run."""
    torch.manual_seed(0)
    return tiny()


class _NoLearningRate(torch.optim.Optimizer):
    """Plain gradient steps of a fixed size, with no ``lr`` in its parameter groups."""

    def __init__(self, params) -> None:
        super().__init__(params, {})

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.add_(p.grad, alpha=-0.05)


def one_layer_without_lr() -> dlci.Target:
    """One layer, an optimizer without a learning rate: two variants cannot apply."""
    return dlci.Target(nn.Linear(10, 4), _NoLearningRate, _data(), loss_fn=nn.CrossEntropyLoss())


def own_train_step() -> dlci.Target:
    """``tiny`` with its own train_step: the shuffled labels reach it through the batch."""

    def step(model, batch, optimizer):
        inputs, labels = batch
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(inputs), labels)
        loss.backward()
        optimizer.step()
        return loss

    target = tiny()
    target.train_step = step
    return target


def broken_on_seed_1() -> dlci.Target:
    """``tiny`` that learns nothing in seed 1's run: seed-sensitive code, as --seeds finds it."""
    target = tiny()
    if torch.initial_seed() == 1:
        target.optimizer = lambda p: torch.optim.Adam(p, lr=1e-9)
    return target


def floods_stdout() -> dlci.Target:
    """``tiny``, whose factory floods standard output: by print (buffered) and at the file
    descriptor (as a C library or a child process would)."""
    print("FLOOD " * 20_000)
    os.write(1, b"RAW-FLOOD " * 10_000)
    return tiny()
