"""A bug zoo: small real targets, each with one planted bug that trains without crashing.

Classification: 4 Gaussian blobs in 10 dimensions, an MLP with BatchNorm and dropout.
Regression: a noisy linear function of 8 inputs, an MLP with tanh. Each factory is seeded.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import dlci

CLASSES = 4


def _blobs(n: int = 512) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    labels = torch.randint(0, CLASSES, (n,), generator=g)
    centers = torch.randn(CLASSES, 10, generator=g)  # overlapping: no perfect score
    return centers[labels] + torch.randn(n, 10, generator=g), labels


def _loaders(x, y, *, shuffle: bool = True):
    cut = int(len(y) * 0.8)
    g = torch.Generator().manual_seed(0)
    train = DataLoader(TensorDataset(x[:cut], y[:cut]), batch_size=32, shuffle=shuffle, generator=g)
    val = DataLoader(TensorDataset(x[cut:], y[cut:]), batch_size=64)
    return train, val


class MLP(nn.Module):
    def __init__(self, norm: nn.Module | None = None, detach_first: bool = False) -> None:
        super().__init__()
        self.first = nn.Linear(10, 64)
        self.norm = norm if norm is not None else nn.BatchNorm1d(64)
        self.act = nn.ReLU()
        self.drop = nn.Dropout(0.1)
        self.last = nn.Linear(64, CLASSES)
        self.detach_first = detach_first

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.first(x)
        if self.detach_first:
            h = h.detach()  # the planted bug: nothing before this point learns
        return self.last(self.drop(self.act(self.norm(h))))


def classification(
    *, model: nn.Module | None = None, lr: float = 3e-3, shuffle: bool = True, x_y=None, **kwargs
) -> dlci.Target:
    torch.manual_seed(0)
    x, y = x_y if x_y is not None else _blobs()
    train, val = _loaders(x, y, shuffle=shuffle)
    return dlci.Target(
        model or MLP(),
        lambda p: torch.optim.Adam(p, lr=lr),
        train,
        loss_fn=nn.CrossEntropyLoss(),
        val_loader=val,
        num_classes=CLASSES,
        **kwargs,
    )


class Regressor(nn.Module):
    def __init__(self, squeeze: bool = True) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 1))
        self.squeeze = squeeze

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.net(x)
        return out.squeeze(-1) if self.squeeze else out


def regression(*, squeeze: bool = True) -> dlci.Target:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(2)
    x = torch.randn(512, 8, generator=g)
    y = x @ torch.randn(8, generator=g) + 0.1 * torch.randn(512, generator=g)
    train, val = _loaders(x, y)
    return dlci.Target(
        Regressor(squeeze),
        lambda p: torch.optim.Adam(p, lr=3e-3),
        train,
        loss_fn=nn.MSELoss(),
        val_loader=val,
    )


def standard_step(model, batch, optimizer):
    model.train()
    optimizer.zero_grad()
    loss = nn.functional.cross_entropy(model(batch[0]), batch[1])
    loss.backward()
    optimizer.step()
    return loss


def evaluate(model, batch):
    model.eval()
    return model(batch[0])


# ----------------------------------------------------------------------------- clean


def clean_classification() -> dlci.Target:
    """Clean, with the user's own train_step and eval_step."""
    return classification(train_step=standard_step, eval_step=evaluate)


def clean_regression() -> dlci.Target:
    return regression()


# ----------------------------------------------------------------------------- bugs


def no_zero_grad() -> dlci.Target:
    def step(model, batch, optimizer):
        loss = nn.functional.cross_entropy(model(batch[0]), batch[1])
        loss.backward()  # the planted bug: no optimizer.zero_grad()
        optimizer.step()
        return loss

    return classification(train_step=step)


def sorted_by_class() -> dlci.Target:
    x, y = _blobs()
    order = torch.argsort(y, stable=True)
    return classification(x_y=(x[order], y[order]), shuffle=False)


def broadcast_output() -> dlci.Target:
    return regression(squeeze=False)  # (N, 1) predictions against (N,) targets


def optimizer_subset() -> dlci.Target:
    target = classification()
    model = target.model
    target.optimizer = lambda params: torch.optim.Adam(model.last.parameters(), lr=3e-3)
    return target


def lr_far_too_high() -> dlci.Target:
    return classification(lr=10.0)


def per_batch_norm_at_eval() -> dlci.Target:
    return classification(model=MLP(norm=nn.BatchNorm1d(64, track_running_stats=False)))


def eval_without_eval_mode() -> dlci.Target:
    return classification(eval_step=lambda model, batch: model(batch[0]))


def detached_layer() -> dlci.Target:
    return classification(model=MLP(detach_first=True))


def softmax_before_cross_entropy() -> dlci.Target:
    torch.manual_seed(0)
    return classification(model=nn.Sequential(MLP(), nn.Softmax(dim=1)))


def dead_relus() -> dlci.Target:
    torch.manual_seed(0)
    model = MLP(norm=nn.Identity())
    with torch.no_grad():
        model.first.bias.fill_(-20.0)  # every unit starts (and stays) below zero
    return classification(model=model)


def labels_permuted() -> dlci.Target:
    x, y = _blobs()
    g = torch.Generator().manual_seed(7)
    return classification(
        x_y=(x, y[torch.randperm(len(y), generator=g)])
    )  # labels lost their inputs


def feature_encodes_label() -> dlci.Target:
    x, y = _blobs()
    x = x.clone()
    x[:, :CLASSES] = (
        nn.functional.one_hot(y, CLASSES).float() * 3
    )  # the planted bug: the label, one-hot
    return classification(x_y=(x, y))


def lr_far_too_low() -> dlci.Target:
    return classification(lr=1e-9)


def _unseeded_factory() -> dlci.Target:
    torch.seed()  # the planted bug: a fresh random seed every time the target is built
    model = MLP()
    x, y = _blobs()
    train, val = _loaders(x, y)
    return dlci.Target(
        model,
        lambda p: torch.optim.Adam(p, lr=3e-3),
        train,
        loss_fn=nn.CrossEntropyLoss(),
        val_loader=val,
        num_classes=CLASSES,
    )


def unseeded_initialisation() -> dlci.Target:
    return _unseeded_factory()


CLEAN = {"classification": clean_classification, "regression": clean_regression}

# planted bug -> the check that must catch it
BUGS = {
    "no zero_grad": (no_zero_grad, "zero-grad"),
    "data sorted by class": (sorted_by_class, "shuffle"),
    "(N, 1) output against (N,) target": (broadcast_output, "loss-broadcast"),
    "optimizer over a subset": (optimizer_subset, "optimizer-coverage"),
    "learning rate far too high": (lr_far_too_high, "update-ratio"),
    "per-batch normalization at eval": (per_batch_norm_at_eval, "batch-independence"),
    "eval without model.eval()": (eval_without_eval_mode, "train-eval-mode"),
    "a detached layer": (detached_layer, "grad-flow"),
    "softmax before cross-entropy": (softmax_before_cross_entropy, "initial-loss"),
    "dead ReLUs": (dead_relus, "activations"),
    "labels permuted": (labels_permuted, "label-alignment"),
    "a feature that encodes the label": (feature_encodes_label, "leakage"),
    "learning rate far too low": (lr_far_too_low, "lr-range"),
    "unseeded initialisation": (unseeded_initialisation, "reproducibility"),
}

# checks that rebuild the target get its function too
FACTORIES = {"unseeded initialisation": _unseeded_factory}
