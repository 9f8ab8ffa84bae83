"""Task shapes for the memorization gate: one small real model per kind of loss.

Each shape comes healthy and in three variants that cannot learn: ``frozen`` (a training
step that forgets ``optimizer.step()``), ``lr0`` and ``lr1e-9``. The losses start where
their tasks start (ln 2 for a binary classifier, 0.01 for a regression on targets of scale
0.1, 10^4 on targets of scale 100), which is what an absolute threshold cannot judge.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import dlci

GAUSSIAN_EPS = 1e-2  # the variance clamp: 0.5 * ln(eps) is the floor the loss can reach
SHAPES = (
    "binary",
    "multiclass",
    "multilabel",
    "mse-small",
    "mse-large",
    "gaussian-nll",
    "token-lm",
    "segmentation",
)
VARIANTS = ("frozen", "lr0", "lr1e-9")
VOCAB, SEQ = 32, 8


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _data(shape: str) -> tuple[torch.Tensor, torch.Tensor]:
    """64 examples of the shape's inputs and targets."""
    g, n = _gen(SHAPES.index(shape)), 64
    if shape == "token-lm":
        tokens = torch.randint(0, VOCAB, (n, SEQ + 1), generator=g)
        return tokens[:, :-1], tokens[:, 1:]
    if shape == "segmentation":
        images = torch.randn(n, 1, 8, 8, generator=g)
        return images, (images[:, 0] > 0.5).long() + (images[:, 0] > -0.5).long()
    x = torch.randn(n, 12, generator=g)
    if shape == "binary":
        return x, torch.randint(0, 2, (n, 1), generator=g).float()
    if shape == "multiclass":
        return x, torch.randint(0, 10, (n,), generator=g)
    if shape == "multilabel":
        return x, torch.randint(0, 2, (n, 5), generator=g).float()
    scale = {"mse-small": 0.1, "mse-large": 100.0, "gaussian-nll": 1.0}[shape]
    return x, scale * torch.randn(n, 1, generator=g)


class _TokenLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 16)
        self.rnn = nn.GRU(16, 32, batch_first=True)
        self.head = nn.Linear(32, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(self.embed(tokens))
        return self.head(out)  # (N, T, V)


class _GaussianHead(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(12, 32), nn.Tanh(), nn.Linear(32, 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)  # mean and log-variance


def _model(shape: str) -> nn.Module:
    torch.manual_seed(0)
    if shape == "token-lm":
        return _TokenLM()
    if shape == "segmentation":
        return nn.Sequential(
            nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 3, 3, padding=1)
        )
    if shape == "gaussian-nll":
        return _GaussianHead()
    outputs = {"binary": 1, "multiclass": 10, "multilabel": 5}.get(shape, 1)
    return nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, outputs))


def _loss(shape: str):
    if shape in ("binary", "multilabel"):
        return nn.BCEWithLogitsLoss()
    if shape in ("multiclass", "segmentation"):
        return nn.CrossEntropyLoss()
    if shape == "token-lm":
        ce = nn.CrossEntropyLoss()
        return lambda logits, targets: ce(logits.reshape(-1, VOCAB), targets.reshape(-1))
    if shape == "gaussian-nll":
        nll = nn.GaussianNLLLoss(eps=GAUSSIAN_EPS)
        return lambda out, y: nll(out[:, :1], y, out[:, 1:].exp())
    return nn.MSELoss()


def forgets_step(loss_fn):
    """A training step that computes and backpropagates the loss, and never steps."""

    def step(model, batch, optimizer):
        optimizer.zero_grad()
        loss = loss_fn(model(batch[0]), batch[1])
        loss.backward()
        return loss

    return step


def target(shape: str, variant: str = "healthy") -> dlci.Target:
    """The shape's Target; ``variant`` healthy, frozen, lr0 or lr1e-9."""
    x, y = _data(shape)
    # Adam moves each weight by about lr a step: targets of scale 100 need a larger rate to
    # travel that far in the PR tier's 100 epochs (at 1e-2 the loss reaches ~20-35% of its start)
    healthy_lr = 3e-2 if shape == "mse-large" else 1e-2
    lr = {"lr0": 0.0, "lr1e-9": 1e-9}.get(variant, healthy_lr)
    loss = _loss(shape)
    step = forgets_step(loss) if variant == "frozen" else None
    return dlci.Target(
        model=_model(shape),
        optimizer=lambda params: torch.optim.Adam(params, lr=lr),
        train_loader=DataLoader(
            TensorDataset(x, y), batch_size=16, shuffle=True, generator=_gen(9)
        ),
        loss_fn=loss,
        train_step=step,
        # GaussianNLLLoss clamps the variance at eps: 0.5 * ln(eps) is the lowest it can reach
        loss_floor=0.5 * math.log(GAUSSIAN_EPS) if shape == "gaussian-nll" else None,
    )
