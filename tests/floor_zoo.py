"""Healthy models of the shapes real projects train, for the memorization gate (issue 43).

None of them has a loss that falls to 0 from a uniform start at Adam 3e-3's pace: label
smoothing, soft-target distillation and mixup stop at their targets' entropy, an InfoNCE loss
at its temperature's bound, Poisson counts below 0; a VAE, a denoising diffusion step and a
re-masked LM draw anew at every step; a transformer fine-tuned at 5e-5 and plain SGD at 0.01
learn slowly; CTC starts far above what its label priors alone reach. Each comes healthy and
with twins that cannot learn: ``lr0`` (its own optimizer at lr 0), ``frozen`` (a step that
never steps) and, where it applies, ``blind`` (the model fed zeros: it never sees its inputs).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import dlci
from memorize_zoo import forgets_step

N, FEATURES, CLASSES = 64, 12, 10
SHAPES = (
    "label-smoothing",
    "distillation",
    "mixup",
    "infonce",
    "focal",
    "ctc",
    "poisson",
    "vae",
    "diffusion",
    "masked-lm",
    "finetune-5e-5",
    "sgd-0.01",
)
# the twins each shape has besides lr0: frozen for a train_step of its own, blind where the
# inputs can be cut
TWINS = {
    "label-smoothing": ("lr0", "blind"),
    "distillation": ("lr0", "blind"),
    "mixup": ("lr0",),
    "infonce": ("lr0", "blind"),
    "focal": ("lr0", "blind"),
    "ctc": ("lr0", "blind"),
    "poisson": ("lr0", "blind"),
    "vae": ("lr0",),
    "diffusion": ("lr0", "frozen"),
    "masked-lm": ("lr0", "frozen"),
    "finetune-5e-5": ("lr0", "blind"),
    "sgd-0.01": ("lr0",),
}
VOCAB, SEQ, T_CTC, LABELS_CTC = 24, 12, 16, 8


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


class _Blind(nn.Module):
    """The model fed zeros: what it outputs cannot depend on its inputs."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, *inputs: torch.Tensor) -> object:
        return self.inner(*(torch.zeros_like(x) for x in inputs))


def _mlp(out: int, inp: int = FEATURES, hidden: int = 64) -> nn.Module:
    return nn.Sequential(nn.Linear(inp, hidden), nn.ReLU(), nn.Linear(hidden, out))


def _loader(*tensors: torch.Tensor) -> DataLoader:
    return DataLoader(TensorDataset(*tensors), batch_size=16, shuffle=True, generator=_gen(9))


def _soft_ce(logits: torch.Tensor, soft: torch.Tensor) -> torch.Tensor:
    return -(soft * F.log_softmax(logits, dim=-1)).sum(-1).mean()


def _focal(logits: torch.Tensor, labels: torch.Tensor, gamma: float = 2.0) -> torch.Tensor:
    logp = F.log_softmax(logits, dim=-1).gather(1, labels[:, None]).squeeze(1)
    return (-((1 - logp.exp()) ** gamma) * logp).mean()


class _TwoViews(nn.Module):
    """A SimCLR-style encoder: both views through one network, embeddings out."""

    def __init__(self) -> None:
        super().__init__()
        self.net = _mlp(16)

    def forward(self, views: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.net(views[:, 0]), self.net(views[:, 1])


def _info_nce(embeddings: tuple[torch.Tensor, torch.Tensor], _unused: torch.Tensor) -> torch.Tensor:
    z1, z2 = (F.normalize(z, dim=-1) for z in embeddings)
    logits = z1 @ z2.T / 0.5
    labels = torch.arange(len(z1), device=z1.device)
    return (F.cross_entropy(logits, labels) + F.cross_entropy(logits.T, labels)) / 2


class _CTCModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.rnn = nn.GRU(8, 48, batch_first=True, bidirectional=True)
        self.head = nn.Linear(96, LABELS_CTC + 1)

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(frames)
        return self.head(out).log_softmax(-1).transpose(0, 1)  # (T, N, C): CTC's time-major


def _ctc(log_probs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    n = log_probs.shape[1]
    lengths = torch.full((n,), log_probs.shape[0], dtype=torch.long)
    target_lengths = torch.full((n,), labels.shape[1], dtype=torch.long)
    return F.ctc_loss(log_probs, labels, lengths, target_lengths, zero_infinity=True)


class _VAE(nn.Module):
    """A VAE as tutorials write it: the noise drawn in every forward, eval mode included."""

    def __init__(self) -> None:
        super().__init__()
        self.enc = nn.Sequential(nn.Linear(FEATURES, 64), nn.ReLU(), nn.Linear(64, 8))
        self.dec = nn.Sequential(nn.Linear(4, 64), nn.ReLU(), nn.Linear(64, FEATURES))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        mu, logvar = self.enc(x).chunk(2, dim=-1)
        z = mu + torch.randn_like(mu) * (0.5 * logvar).exp()
        return torch.sigmoid(self.dec(z)), mu, logvar


def _vae_loss(outputs: tuple[torch.Tensor, ...], x: torch.Tensor) -> torch.Tensor:
    recon, mu, logvar = outputs
    bce = F.binary_cross_entropy(recon, x, reduction="sum") / len(x)
    kld = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp()) / len(x)
    return bce + kld


class _Denoiser(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(FEATURES + 1, 128), nn.SiLU(), nn.Linear(128, FEATURES))

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return self.net(torch.cat([x, t[:, None].float() / 100], dim=-1))


def _diffusion_step(frozen: bool):
    """A DDPM training step: noise and timestep drawn inside it at every call."""
    betas = torch.linspace(1e-4, 0.02, 100)
    alphas = torch.cumprod(1 - betas, dim=0)

    def step(model, batch, optimizer):
        x0 = batch[0]
        optimizer.zero_grad()
        t = torch.randint(0, 100, (len(x0),))
        noise = torch.randn_like(x0)
        a = alphas[t][:, None]
        loss = F.mse_loss(model(a.sqrt() * x0 + (1 - a).sqrt() * noise, t), noise)
        loss.backward()
        if not frozen:
            optimizer.step()
        return loss

    return step


class _TinyEncoder(nn.Module):
    """A small transformer encoder with attention dropout inside nn.MultiheadAttention."""

    def __init__(self, classes: int | None = None) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB + 1, 32)
        self.pos = nn.Parameter(torch.randn(SEQ, 32) * 0.02)
        layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.1, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(32, classes or VOCAB)
        self.classes = classes

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        hidden = self.encoder(self.embed(tokens) + self.pos)
        return self.head(hidden.mean(1) if self.classes else hidden)


def _masked_lm_step(frozen: bool):
    """A masked LM step: 15% of the tokens re-masked at every call, the loss on those."""

    def step(model, batch, optimizer):
        tokens = batch[0]
        optimizer.zero_grad()
        mask = torch.rand(tokens.shape) < 0.15
        mask[:, 0] = True  # at least one masked token per example
        logits = model(tokens.masked_fill(mask, VOCAB))
        loss = F.cross_entropy(logits[mask], tokens[mask])
        loss.backward()
        if not frozen:
            optimizer.step()
        return loss

    return step


def _data(shape: str) -> tuple[torch.Tensor, torch.Tensor]:
    g = _gen(SHAPES.index(shape) + 100)
    x = torch.randn(N, FEATURES, generator=g)
    labels = torch.randint(0, CLASSES, (N,), generator=g)
    if shape == "distillation":
        teacher = _mlp(CLASSES)
        with torch.no_grad():
            return x, F.softmax(
                teacher(x) * 12 / 2.0, dim=-1
            )  # a confident teacher at temperature 2
    if shape == "mixup":
        perm, lam = torch.randperm(N, generator=g), 0.7
        onehot = F.one_hot(labels, CLASSES).float()
        return lam * x + (1 - lam) * x[perm], lam * onehot + (1 - lam) * onehot[perm]
    if shape == "infonce":
        views = x[:, None] + 0.1 * torch.randn(N, 2, FEATURES, generator=g)
        return views, torch.zeros(N)
    if shape == "ctc":
        frames = torch.randn(N, T_CTC, 8, generator=g)
        # label priors far from uniform: two labels of eight carry most of the targets
        common = torch.randint(1, 3, (N, 5), generator=g)
        rare = torch.randint(1, LABELS_CTC + 1, (N, 5), generator=g)
        return frames, torch.where(torch.rand(N, 5, generator=g) < 0.9, common, rare)
    if shape == "poisson":
        return x, torch.poisson(torch.full((N, 4), 8.0), generator=g)
    if shape == "vae":
        pixels = torch.rand(N, FEATURES, generator=g)
        return pixels, pixels  # the targets are the inputs
    if shape == "diffusion":
        return torch.rand(N, FEATURES, generator=g), torch.zeros(N)
    if shape in ("masked-lm", "finetune-5e-5"):
        tokens = torch.randint(0, VOCAB, (N, SEQ), generator=g)
        return tokens, (tokens[:, 0] + tokens[:, 1]) % 4
    return x, labels


def _model(shape: str) -> nn.Module:
    torch.manual_seed(0)
    if shape == "infonce":
        return _TwoViews()
    if shape == "ctc":
        return _CTCModel()
    if shape == "vae":
        return _VAE()
    if shape == "diffusion":
        return _Denoiser()
    if shape == "masked-lm":
        return _TinyEncoder()
    if shape == "finetune-5e-5":
        return _TinyEncoder(classes=4)
    return _mlp({"poisson": 4}.get(shape, CLASSES))


def _loss(shape: str):
    return {
        "label-smoothing": nn.CrossEntropyLoss(label_smoothing=0.1),
        "distillation": _soft_ce,
        "mixup": _soft_ce,
        "infonce": _info_nce,
        "focal": _focal,
        "ctc": _ctc,
        "poisson": nn.PoissonNLLLoss(log_input=True),
        "vae": _vae_loss,
        "finetune-5e-5": nn.CrossEntropyLoss(),
        "sgd-0.01": nn.CrossEntropyLoss(),
    }.get(shape)


def _optimizer(shape: str, lr_zero: bool):
    if shape == "finetune-5e-5":
        lr = 0.0 if lr_zero else 5e-5
        return lambda params: torch.optim.AdamW(params, lr=lr, weight_decay=0.01)
    if shape == "sgd-0.01":
        return lambda params: torch.optim.SGD(params, lr=0.0 if lr_zero else 0.01)
    lr = 0.0 if lr_zero else 3e-3
    return lambda params: torch.optim.Adam(params, lr=lr)


def target(shape: str, variant: str = "healthy") -> dlci.Target:
    """The shape's Target; ``variant`` healthy, lr0, frozen or blind."""
    x, y = _data(shape)
    model = _model(shape)
    if variant == "blind":
        model = _Blind(model)
    loss = _loss(shape)
    step = None
    if shape == "diffusion":
        step = _diffusion_step(frozen=variant == "frozen")
    elif shape == "masked-lm":
        step = _masked_lm_step(frozen=variant == "frozen")
    elif variant == "frozen":
        step = forgets_step(loss)
    return dlci.Target(
        model=model,
        optimizer=_optimizer(shape, variant == "lr0"),
        train_loader=_loader(x, y),
        loss_fn=loss,
        train_step=step,
    )
