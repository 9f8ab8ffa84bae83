"""A healthy zoo: small real targets of the shapes people train, each with nothing wrong.

The doctor must raise no failure on any of them (tests/test_doctor_healthy.py). The data is
synthetic and seeded: inputs on a unit scale, labels that a model learns in a few dozen steps
but not perfectly in twenty, no example shared between the splits, and the class signal
spread over many features rather than carried by one. Each factory seeds torch itself, so
building one twice gives the same target.
"""

from __future__ import annotations

import weakref

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

import dlci

CLASSES, SIZE, VOCAB, LENGTH = 4, 512, 16, 12


def _loaders(x, y, *, batch_size: int = 32):
    cut = int(len(y) * 0.75)
    g = torch.Generator().manual_seed(0)
    train = DataLoader(
        TensorDataset(x[:cut], y[:cut]), batch_size=batch_size, shuffle=True, generator=g
    )
    return train, DataLoader(TensorDataset(x[cut:], y[cut:]), batch_size=64)


def _images(seed: int = 3):
    """(N, 1, 8, 8) gratings in four orientations at a random phase under unit noise,
    standardised per pixel: no single pixel tells the class."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, CLASSES, (SIZE,), generator=g)
    angle = labels.float() * torch.pi / CLASSES
    rows, cols = torch.meshgrid(torch.arange(8.0), torch.arange(8.0), indexing="ij")
    along = torch.cos(angle)[:, None, None] * cols + torch.sin(angle)[:, None, None] * rows
    phase = torch.rand(SIZE, 1, 1, generator=g) * 2 * torch.pi
    x = 0.8 * torch.cos(1.6 * along + phase) + torch.randn(SIZE, 8, 8, generator=g)
    x = x[:, None]
    return (x - x.mean(0)) / x.std(0), labels


def _features(seed: int = 4, dim: int = 16):
    """(N, dim) Gaussian features and four classes from a noisy linear score."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(SIZE, dim, generator=g)
    scores = x @ torch.randn(dim, CLASSES, generator=g) / dim**0.5
    labels = (scores + 0.5 * torch.randn(SIZE, CLASSES, generator=g)).argmax(dim=1)
    return x, labels


def _tokens(seed: int = 5):
    """(N, LENGTH) token ids; each class draws a quarter of its tokens from its own four."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, CLASSES, (SIZE,), generator=g)
    tokens = torch.randint(0, VOCAB, (SIZE, LENGTH), generator=g)
    own = labels[:, None] * 4 + torch.randint(0, 4, (SIZE, LENGTH), generator=g)
    pick = torch.rand(SIZE, LENGTH, generator=g) < 0.25
    return torch.where(pick, own, tokens), labels


def _classifier(model, data, *, lr: float = 3e-3, **kwargs) -> dlci.Target:
    train, val = _loaders(*data)
    kwargs.setdefault("optimizer", lambda p: torch.optim.Adam(p, lr=lr))
    return dlci.Target(
        model,
        train_loader=train,
        loss_fn=nn.CrossEntropyLoss(),
        val_loader=val,
        num_classes=CLASSES,
        **kwargs,
    )


# ----------------------------------------------------------------------------- models


class FunctionalCNN(nn.Module):
    """Conv-BatchNorm blocks whose ReLU and pooling are functional calls."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16)
        self.conv2, self.bn2 = nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32)
        self.head = nn.Linear(32, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.relu(self.bn2(self.conv2(x)))
        return self.head(F.adaptive_avg_pool2d(x, 1).flatten(1))


class Block(nn.Module):
    """A basic residual block; its last BatchNorm's gamma starts at zero (Goyal et al. 2017)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.conv1, self.bn1 = (
            nn.Conv2d(width, width, 3, padding=1, bias=False),
            nn.BatchNorm2d(width),
        )
        self.conv2, self.bn2 = (
            nn.Conv2d(width, width, 3, padding=1, bias=False),
            nn.BatchNorm2d(width),
        )
        self.relu = nn.ReLU(inplace=True)
        nn.init.zeros_(self.bn2.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        return self.relu(x + self.bn2(self.conv2(out)))


class ResNet(nn.Module):
    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(1, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU()
        )
        self.blocks = nn.Sequential(Block(width), Block(width))
        self.head = nn.Linear(width, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.stem(x)).mean(dim=(2, 3)))


class LSTMClassifier(nn.Module):
    """Embedding, one LSTM layer, a linear head on the last hidden state."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 16)
        self.lstm = nn.LSTM(16, 32, batch_first=True)
        self.head = nn.Linear(32, CLASSES)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        _, (hidden, _) = self.lstm(self.embed(tokens))
        return self.head(hidden[-1])


class Encoder(nn.Module):
    """A pre-norm Transformer encoder with GELU; the positional embedding starts at zero, as in
    ViT and BERT-style code."""

    def __init__(self, width: int = 32) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, width)
        self.position = nn.Parameter(torch.zeros(1, LENGTH, width))
        layer = nn.TransformerEncoderLayer(
            width, 2, 64, dropout=0.1, activation="gelu", batch_first=True, norm_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, CLASSES)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.encoder(self.embed(tokens) + self.position)
        return self.head(self.norm(h).mean(dim=1))


class CausalLM(nn.Module):
    """A one-block GPT: token and position embeddings, masked self-attention, a GELU MLP and
    a next-token head; forward returns ``(logits, None)``, as research code that computes
    its loss outside the model does. ``causal=False`` drops the mask (the planted bug)."""

    def __init__(self, width: int = 32, causal: bool = True, masked: bool = False) -> None:
        super().__init__()
        self.masked = masked  # token 0 never predicted: its logit is -inf (a padding id)
        self.embed = nn.Embedding(VOCAB, width)
        self.position = nn.Parameter(0.02 * torch.randn(1, LENGTH, width))
        self.block = nn.TransformerEncoderLayer(
            width, 2, 64, dropout=0.0, activation="gelu", batch_first=True, norm_first=True
        )
        self.head = nn.Linear(width, VOCAB)
        self.causal = causal

    def forward(self, tokens: torch.Tensor) -> tuple[torch.Tensor, None]:
        length = tokens.shape[1]
        mask = nn.Transformer.generate_square_subsequent_mask(length) if self.causal else None
        h = self.block(self.embed(tokens) + self.position[:, :length], src_mask=mask)
        logits = self.head(h)
        if self.masked:
            logits = logits.masked_fill(torch.arange(VOCAB) == 0, float("-inf"))
        return logits, None


def next_token_loss(outputs: tuple[torch.Tensor, None], targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(outputs[0].reshape(-1, VOCAB), targets.reshape(-1))


def _sequences(seed: int = 6):
    """(N, LENGTH) tokens counting up from a random start by a step of 1, 2 or 3 (mod VOCAB),
    a token in eight replaced at random; the targets are the next tokens."""
    g = torch.Generator().manual_seed(seed)
    start = torch.randint(0, VOCAB, (SIZE, 1), generator=g)
    step = torch.randint(1, 4, (SIZE, 1), generator=g)
    seq = (start + step * torch.arange(LENGTH + 1)) % VOCAB
    noise = torch.rand(SIZE, LENGTH + 1, generator=g) < 0.125
    seq = torch.where(noise, torch.randint(0, VOCAB, seq.shape, generator=g), seq)
    return seq[:, :-1], seq[:, 1:]


def causal_lm(*, causal: bool = True, masked: bool = False) -> dlci.Target:
    """Next-token prediction with a causal mask; outputs a (logits, None) tuple."""
    torch.manual_seed(0)
    train, val = _loaders(*_sequences())
    return dlci.Target(
        CausalLM(causal=causal, masked=masked),
        lambda p: torch.optim.AdamW(p, lr=1e-3),
        train,
        loss_fn=next_token_loss,
        val_loader=val,
        num_classes=VOCAB,
    )


def causal_lm_unshifted() -> dlci.Target:
    """The planted bug: the targets are the inputs themselves, under a loss that does not
    shift them (each position learns to copy the token it reads)."""
    target = causal_lm()
    x = _sequences()[0]
    target.train_loader, target.val_loader = _loaders(x, x.clone())
    return target


def _mlp(inputs: int, outputs: int, act: type[nn.Module], width: int = 64) -> nn.Sequential:
    return nn.Sequential(
        nn.Linear(inputs, width), act(), nn.Linear(width, width), act(), nn.Linear(width, outputs)
    )


class ReZeroMLP(nn.Module):
    """Residual branches scaled by a learned alpha that starts at zero (ReZero, Bachlechner et
    al. 2020) under a zero-initialised head (as adaLN-zero and DiT's final layer)."""

    def __init__(self, width: int = 64) -> None:
        super().__init__()
        self.stem = nn.Linear(16, width)
        self.branches = nn.ModuleList(
            nn.Sequential(nn.Linear(width, width), nn.SiLU(), nn.Linear(width, width))
            for _ in range(2)
        )
        self.alpha = nn.Parameter(torch.zeros(2))
        self.head = nn.Linear(width, CLASSES)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stem(x)
        for alpha, branch in zip(self.alpha, self.branches, strict=True):
            h = h + alpha * branch(h)
        return self.head(h)


class MishRegressor(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first, self.second = nn.Linear(8, 64), nn.Linear(64, 64)
        self.out = nn.Linear(64, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.softplus(self.second(F.mish(self.first(x))))
        return self.out(h).squeeze(-1)


class LeakyMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first, self.second = nn.Linear(16, 64), nn.Linear(64, 64)
        self.out = nn.Linear(64, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.leaky_relu(self.first(x), 0.1)
        return self.out(torch.tanh(self.second(h)))


class GeluMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first, self.second = nn.Linear(16, 64), nn.Linear(64, 64)
        self.out = nn.Linear(64, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(F.gelu(self.second(F.gelu(self.first(x)))))


# ----------------------------------------------------------------------------- targets


def cnn_batchnorm_functional() -> dlci.Target:
    torch.manual_seed(0)
    return _classifier(FunctionalCNN(), _images())


def resnet_zero_init_gamma() -> dlci.Target:
    torch.manual_seed(0)
    return _classifier(ResNet(), _images())


def lstm_classifier() -> dlci.Target:
    torch.manual_seed(0)
    return _classifier(LSTMClassifier(), _tokens())


def transformer_zero_positions() -> dlci.Target:
    torch.manual_seed(0)
    return _classifier(
        Encoder(), _tokens(), optimizer=lambda p: torch.optim.AdamW(p, lr=1e-3, weight_decay=0.01)
    )


def rezero_zero_head() -> dlci.Target:
    torch.manual_seed(0)
    return _classifier(ReZeroMLP(), _features())


def multilabel_bce(*, leak: bool = False) -> dlci.Target:
    """Five independent yes/no labels per example, SiLU modules, BCEWithLogitsLoss. ``leak``
    plants a bug: the five labels appended to the inputs as -3 / +3."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(6)
    x = torch.randn(SIZE, 16, generator=g)
    scores = x @ torch.randn(16, 5, generator=g) / 4 + 0.5 * torch.randn(SIZE, 5, generator=g)
    labels = (scores > 0).float()
    if leak:
        x = torch.cat([x, 6 * labels - 3], dim=1)
    train, val = _loaders(x, labels)
    return dlci.Target(
        _mlp(x.shape[1], 5, nn.SiLU),
        lambda p: torch.optim.Adam(p, lr=3e-3),
        train,
        loss_fn=nn.BCEWithLogitsLoss(),
        val_loader=val,
    )


def regression_sgd_momentum() -> dlci.Target:
    """A smooth nonlinear function of 8 inputs, Mish and softplus, SGD with Nesterov momentum."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(7)
    x = torch.randn(SIZE, 8, generator=g)
    y = torch.sin(x @ torch.randn(8, generator=g) / 2) + 0.3 * x[:, 0] * x[:, 1]
    y = y + 0.1 * torch.randn(SIZE, generator=g)
    train, val = _loaders(x, (y - y.mean()) / y.std())
    return dlci.Target(
        MishRegressor(),
        lambda p: torch.optim.SGD(p, lr=0.01, momentum=0.9, nesterov=True),
        train,
        loss_fn=nn.MSELoss(),
        val_loader=val,
    )


class GaussianHeads(nn.Module):
    """A mean head and a log-variance head over one body: (N, 2) outputs, mean and variance."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 64), nn.SiLU(), nn.Linear(64, 64), nn.SiLU())
        self.mean, self.log_var = nn.Linear(64, 1), nn.Linear(64, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.body(x)
        return torch.cat([self.mean(h), self.log_var(h).exp()], dim=1)


def gaussian_nll(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.gaussian_nll_loss(outputs[:, 0], targets, outputs[:, 1])


def regression_gaussian_nll(*, scale: float = 0.5, permute: bool = False) -> dlci.Target:
    """A mean and a variance per example (noise that grows with one input), GaussianNLLLoss,
    targets in their own units (sd ``scale``): the loss starts near 0.07 and goes below zero
    as the model learns. ``permute`` plants the label bug: targets shuffled away from inputs."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(8)
    x = torch.randn(SIZE, 8, generator=g)
    y = torch.sin(x @ torch.randn(8, generator=g) / 2) + 0.3 * x[:, 0] * x[:, 1]
    y = y + (0.05 + 0.25 * torch.sigmoid(2 * x[:, 2])) * torch.randn(SIZE, generator=g)
    y = scale * (y - y.mean()) / y.std()
    if permute:
        y = y[torch.randperm(SIZE, generator=torch.Generator().manual_seed(7))]
    train, val = _loaders(x, y)
    return dlci.Target(
        GaussianHeads(),
        lambda p: torch.optim.Adam(p, lr=3e-3),
        train,
        loss_fn=gaussian_nll,
        val_loader=val,
    )


class FrozenBackbone(nn.Module):
    """A backbone whose weights are frozen (as after pretraining) and a trainable head."""

    def __init__(self) -> None:
        super().__init__()
        self.backbone = nn.Sequential(
            nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.LayerNorm(64), nn.ReLU()
        )
        self.backbone.requires_grad_(False)
        self.head = nn.Sequential(nn.Linear(64, 64), nn.GELU(), nn.Linear(64, CLASSES))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(x))


def frozen_backbone() -> dlci.Target:
    torch.manual_seed(0)
    return _classifier(FrozenBackbone(), _features())


def clipping_onecycle() -> dlci.Target:
    """The user's own train_step: gradient clipping, then a OneCycleLR step per batch."""
    torch.manual_seed(0)
    schedulers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def train_step(model, batch, optimizer):
        if optimizer not in schedulers:  # one schedule per optimizer, as a Trainer builds it
            schedulers[optimizer] = torch.optim.lr_scheduler.OneCycleLR(
                optimizer, max_lr=1e-2, total_steps=100_000
            )
        model.train()
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(batch[0]), batch[1])
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
        optimizer.step()
        schedulers[optimizer].step()
        return loss

    return _classifier(
        LeakyMLP(),
        _features(),
        optimizer=lambda p: torch.optim.AdamW(p, lr=1e-2),
        train_step=train_step,
    )


def bf16_autocast_cpu() -> dlci.Target:
    """Forward and loss under CPU autocast to bfloat16, in the user's own steps."""
    torch.manual_seed(0)

    def train_step(model, batch, optimizer):
        model.train()
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(batch[0]), batch[1])
        loss.backward()
        optimizer.step()
        return loss

    def eval_step(model, batch):
        model.eval()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return model(batch[0]).float()

    return _classifier(GeluMLP(), _features(), train_step=train_step, eval_step=eval_step)


HEALTHY = {
    "CNN, BatchNorm, functional ReLU": cnn_batchnorm_functional,
    "ResNet, zero-init last BN gamma": resnet_zero_init_gamma,
    "LSTM classifier": lstm_classifier,
    "Transformer, zero pos-embedding, GELU": transformer_zero_positions,
    "causal LM, (logits, None) outputs": causal_lm,
    "ReZero branches, zero-init head, SiLU": rezero_zero_head,
    "multi-label, BCEWithLogits, SiLU": multilabel_bce,
    "regression, SGD + Nesterov, Mish": regression_sgd_momentum,
    "regression, Gaussian NLL below zero": regression_gaussian_nll,
    "frozen backbone": frozen_backbone,
    "clipping + OneCycleLR, leaky ReLU, tanh": clipping_onecycle,
    "bf16 autocast on the CPU, GELU": bf16_autocast_cpu,
}
