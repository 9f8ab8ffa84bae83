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


def leaked_feature() -> dlci.Target:
    """One column is the label for 90% of the rows (a random class for the rest), on a unit
    scale: the task gets easier, but not perfect after 20 steps."""
    x, y = _blobs()
    g = torch.Generator().manual_seed(3)
    leak = torch.where(
        torch.rand(len(y), generator=g) < 0.9, y, torch.randint(0, CLASSES, y.shape, generator=g)
    )
    x = x.clone()
    x[:, 9] = (leak.float() - 1.5) / 1.1 + 0.1 * torch.randn(len(y), generator=g)
    return classification(x_y=(x, y))


def split_overlap() -> dlci.Target:
    """30 of the 103 held-out rows are copies of training rows, with their labels."""
    x, y = _blobs()
    x, y = x.clone(), y.clone()
    cut = int(len(y) * 0.8)
    x[cut : cut + 30], y[cut : cut + 30] = x[100:130], y[100:130]
    return classification(x_y=(x, y))


def unscaled_inputs() -> dlci.Target:
    """Inputs left as 8-bit pixel values, 0 to 255."""
    x, y = _blobs()
    return classification(x_y=((x * 32 + 128).clamp(0, 255).round(), y))


def held_out_normalised_otherwise() -> dlci.Target:
    """Raw measurements (mean 10, sd about 6); the training rows standardised with their own
    statistics, the held-out rows min-max scaled to [0, 1] instead."""
    x, y = _blobs()
    raw = x * 4 + 10
    cut = int(len(y) * 0.8)
    train, val = raw[:cut], raw[cut:]
    train = (train - train.mean(0)) / train.std(0)
    val = (val - val.min(0).values) / (val.max(0).values - val.min(0).values)
    return classification(x_y=(torch.cat([train, val]), y))


def lr_far_too_low() -> dlci.Target:
    return classification(lr=1e-9)


def label_one_hot_in_inputs() -> dlci.Target:
    """A one-hot copy of the label appended to the inputs: each column gives one class away,
    so the one-feature probe sees a quarter of it."""
    x, y = _blobs()
    return classification(
        x_y=(torch.cat([x[:, :6], nn.functional.one_hot(y, CLASSES).float()], 1), y)
    )


def causal_mask_missing() -> dlci.Target:
    """A next-token model whose attention sees the whole sequence, later tokens included."""
    import healthy_zoo

    return healthy_zoo.causal_lm(causal=False)


def optimizer_closes_over_model() -> dlci.Target:
    """``lambda params: ...(model.parameters())``: the factory ignores what it is given."""
    target = classification()
    model = target.model
    target.optimizer = lambda params: torch.optim.Adam(model.parameters(), lr=3e-3)
    return target


class TupleMLP(MLP):
    """Returns ``(logits, features)``, as many research models do."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return super().forward(x), x


def per_batch_norm_behind_a_tuple() -> dlci.Target:
    target = classification(model=TupleMLP(norm=nn.BatchNorm1d(64, track_running_stats=False)))
    target.loss_fn = lambda outputs, y: nn.functional.cross_entropy(outputs[0], y)
    return target


def no_zero_grad_sgd() -> dlci.Target:
    """No zero_grad under plain SGD at 0.2: the summed gradients blow up the updates, and
    the checks that train (weight-norms, update-ratio, lr-range, label-alignment) see it."""
    target = no_zero_grad()
    target.optimizer = lambda params: torch.optim.SGD(params, lr=0.2)
    return target


class _Raising:
    """A loader whose first batch raises, as a collate function given bad rows does."""

    def __iter__(self):
        raise ValueError("expected sequence of length 5 at dim 1 (got 9)")


def loader_raises() -> dlci.Target:
    target = classification()
    target.train_loader = _Raising()
    return target


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
    "a leaked feature, not perfect early": (leaked_feature, "leakage"),
    "held-out rows copied from training": (split_overlap, "leakage"),
    "unscaled inputs (0-255)": (unscaled_inputs, "input-normalization"),
    "held-out split normalised otherwise": (held_out_normalised_otherwise, "input-normalization"),
    "learning rate far too low": (lr_far_too_low, "lr-range"),
    "unseeded initialisation": (unseeded_initialisation, "reproducibility"),
    "a one-hot copy of the label among the inputs": (label_one_hot_in_inputs, "leakage"),
    "a causal LM without its causal mask": (causal_mask_missing, "causality"),
    "an optimizer factory closed over the model": (
        optimizer_closes_over_model,
        "optimizer-coverage",
    ),
    "per-batch normalization behind tuple outputs": (
        per_batch_norm_behind_a_tuple,
        "batch-independence",
    ),
}

# planted bug -> a fragment of what its check must have measured: a failure caught for the
# right reason, not any failure (an exception inside the check fails with the exception's text)
MEASURED = {
    "no zero_grad": "tensors start with last call's gradient",
    "data sorted by class": "classes per batch in the first 4 batches",
    "(N, 1) output against (N,) target": "(16, 1) with (16,) -> (16, 16)",
    "optimizer over a subset": "2 of 6 trainable tensors",
    "learning rate far too high": "last: ",
    "per-batch normalization at eval": "max difference ",
    "eval without model.eval()": "eval_step ran 2 layer(s) in train mode",
    "a detached layer": "no gradient reaches first",
    "softmax before cross-entropy": "on outputs that sum to 1",
    "dead ReLUs": "act: 100% dead",
    "labels permuted": "with true labels",
    "a feature that encodes the label": "held-out accuracy 100.0% after 20 steps",
    "a leaked feature, not perfect early": "feature 9 alone predicts ",
    "held-out rows copied from training": "30 of 103 held-out examples copy training ones (30 exact)",
    "unscaled inputs (0-255)": "feature 9: rms ",
    "held-out split normalised otherwise": "held-out vs training, median over 10 features",
    "learning rate far too low": "configured 1.0e-09",
    "unseeded initialisation": "largest parameter difference",
    "a one-hot copy of the label among the inputs": "each singling out one class",
    "a causal LM without its causal mask": "the first position to change is",
    "an optimizer factory closed over the model": "6 of them the model's own",
    "per-batch normalization behind tuple outputs": "max difference ",
}

# checks that rebuild the target get its function too
FACTORIES = {"unseeded initialisation": _unseeded_factory}
