"""The one-feature probe: how well each input feature alone predicts the label on held-out
data.

Each feature is cut into 16 bins at its training quantiles; a bin predicts the commonest
training label in it (classification) or the mean training target in it (regression), and
the probe is scored on the held-out split, so a feature cannot look good by memorising the
training rows. Classification reports skill, (accuracy - chance) / (1 - chance), where
chance is predicting the commonest training label; regression reports the held-out R^2 of
the better of the binned probe and a straight line.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

BINS = 16
MAX_FEATURES = 4096  # wider inputs (images past 64x64) are not probed feature by feature
# The defaults of the project's thresholds leakage.warn-skill, fail-skill, warn-r2, fail-r2:
SKILL_WARN, SKILL_FAIL = 0.5, 0.75
R2_WARN, R2_FAIL = 0.9, 0.99


@dataclass
class Probe:
    column: int  # the best feature's column
    score: float  # its skill (classification) or R^2 (regression)
    accuracy: float | None  # classification: its held-out accuracy
    chance: float | None  # classification: the commonest training label's held-out share
    classification: bool

    def bounds(self, policy: Any = None) -> tuple[float, float]:
        """(warn, fail) for this probe's score: the project's (a Policy), else the defaults."""
        if self.classification:
            keys, defaults = ("warn-skill", "fail-skill"), (SKILL_WARN, SKILL_FAIL)
        else:
            keys, defaults = ("warn-r2", "fail-r2"), (R2_WARN, R2_FAIL)
        if policy is None:
            return defaults
        return policy.threshold("leakage", keys[0]), policy.threshold("leakage", keys[1])

    def status(self, policy: Any = None) -> str:
        warn, fail = self.bounds(policy)
        return "fail" if self.score >= fail else "warn" if self.score >= warn else "pass"


def _bins(train: Any, val: Any) -> tuple[Any, Any]:
    """Each value's bin, (F, N), from the training quantiles of its feature."""
    import torch

    levels = torch.linspace(0, 1, BINS + 1, device=train.device)[1:-1]
    edges = torch.quantile(train, levels, dim=0).T.contiguous()  # (F, BINS - 1)
    return (
        torch.searchsorted(edges, train.T.contiguous()),
        torch.searchsorted(edges, val.T.contiguous()),
    )


def classify(train: Any, labels: Any, val: Any, val_labels: Any, classes: int) -> Probe:
    """The best single feature at predicting a class label."""
    import torch

    bt, bv = _bins(train, val)
    features = train.shape[1]
    counts = torch.zeros(features * BINS * classes, device=train.device)
    slot = (torch.arange(features, device=train.device)[:, None] * BINS + bt) * classes
    counts.index_add_(
        0, (slot + labels[None, :]).flatten(), torch.ones(slot.numel(), device=train.device)
    )
    counts = counts.view(features, BINS, classes)
    common = int(torch.bincount(labels, minlength=classes).argmax())
    guess = torch.where(counts.sum(2) > 0, counts.argmax(2), torch.full_like(bt[:, :1], common))
    accuracy = (torch.gather(guess, 1, bv) == val_labels[None, :]).float().mean(1)
    chance = float((val_labels == common).float().mean())
    skill = (accuracy - chance) / max(1e-9, 1 - chance)
    best = int(skill.argmax())
    return Probe(best, float(skill[best]), float(accuracy[best]), chance, True)


def regress(train: Any, targets: Any, val: Any, val_targets: Any) -> Probe:
    """The best single feature at predicting a one-number target."""
    import torch

    bt, bv = _bins(train, val)
    features = train.shape[1]
    slot = (torch.arange(features, device=train.device)[:, None] * BINS + bt).flatten()
    sums = torch.zeros(features * BINS, device=train.device)
    sums.index_add_(0, slot, targets.repeat(features))
    counts = torch.zeros_like(sums).index_add_(0, slot, torch.ones_like(slot, dtype=sums.dtype))
    centre = float(targets.mean())
    means = torch.where(counts > 0, sums / counts.clamp_min(1), centre).view(features, BINS)
    baseline = float(((val_targets - centre) ** 2).mean())
    if baseline <= 0:
        return Probe(0, 0.0, None, None, False)
    binned = 1 - ((torch.gather(means, 1, bv) - val_targets[None, :]) ** 2).mean(1) / baseline
    x = val - val.mean(0)
    y = val_targets - val_targets.mean()
    line = (x * y[:, None]).mean(0) ** 2 / ((x * x).mean(0) * (y * y).mean()).clamp_min(1e-30)
    score = torch.maximum(binned, line)
    best = int(score.argmax())
    return Probe(best, float(score[best]), None, None, False)


SEPARATES = 0.9  # a feature's held-out balanced accuracy at telling one class from the rest
MAX_CELLS = 1 << 24  # features x bins x classes counted for the group probe, at most


@dataclass
class Group:
    """Features that each single out one class, and how well they predict the label together:
    the leak a one-feature probe sees only a part of (a one-hot copy of the label)."""

    columns: list[int]  # one feature per class it singles out
    classes: list[int]
    score: float  # the group's skill, as the one-feature probe's
    accuracy: float
    chance: float


def group(train: Any, labels: Any, val: Any, val_labels: Any, classes: int) -> Group | None:
    """For each class, the feature that best tells it from the others on held-out data (bins
    where the training share of the class is over half predict it; balanced accuracy); the
    classes a feature singles out at SEPARATES or better form the group, which predicts each
    held-out example's class as the one whose feature gives it the highest training share.
    None when fewer than two classes are singled out, or the counts would be too large."""
    import torch

    features = train.shape[1]
    if features * BINS * classes > MAX_CELLS or classes < 2:
        return None
    bt, bv = _bins(train, val)
    device = train.device

    def counts(bins: Any, y: Any) -> Any:
        slot = (torch.arange(features, device=device)[:, None] * BINS + bins) * classes
        out = torch.zeros(features * BINS * classes, device=device)
        out.index_add_(0, (slot + y[None, :]).flatten(), torch.ones(slot.numel(), device=device))
        return out.view(features, BINS, classes)

    seen, held = counts(bt, labels), counts(bv, val_labels)
    shares = seen / seen.sum(2, keepdim=True).clamp_min(1)
    predicts = shares > 0.5  # (F, BINS, C): the bins that predict each class
    per_class = held.sum(1)  # (F, C): held-out examples of each class (the same for every F)
    hits = (held * predicts).sum(1)  # (F, C)
    false = ((held.sum(2, keepdim=True) - held) * predicts).sum(1)
    others = per_class.sum(1, keepdim=True) - per_class
    balanced = (hits / per_class.clamp_min(1) + 1 - false / others.clamp_min(1)) / 2
    balanced = torch.where((per_class > 0) & (others > 0), balanced, torch.zeros_like(balanced))
    best, column = balanced.max(dim=0)  # per class
    chosen = [k for k in range(classes) if float(best[k]) >= SEPARATES]
    if len(chosen) < 2 or len({int(column[k]) for k in chosen}) < 2:
        return None
    cols = [int(column[k]) for k in chosen]
    score = torch.stack(
        [shares[c, bv[c], k] for c, k in zip(cols, chosen, strict=True)], dim=1
    )  # (Nv, G)
    common = int(torch.bincount(labels, minlength=classes).argmax())
    picked = torch.tensor(chosen, device=device)[score.argmax(dim=1)]
    guess = torch.where(score.max(dim=1).values > 0, picked, torch.full_like(picked, common))
    accuracy = float((guess == val_labels).float().mean())
    chance = float((val_labels == common).float().mean())
    skill = (accuracy - chance) / max(1e-9, 1 - chance)
    return Group(cols, chosen, skill, accuracy, chance)
