"""Held-out examples that are copies of training examples: exact (the same bytes) or near (far
closer to a training example than examples usually are to each other).

Exact copies are found by hashing each example; near copies by the distance to the nearest
training example, on features standardised with the training split's statistics (and
projected to 64 random directions when wider, which keeps distances within a few percent:
Johnson-Lindenstrauss). A data set whose examples repeat among themselves (a few categorical
columns, say) repeats across the split too: only the share beyond that is a finding.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Any

# The defaults of the project's thresholds leakage.near-copy, warn-copies and fail-copies:
NEAR = 0.05  # a near copy: within 5% of the median distance between held-out and training
EXCESS_WARN, EXCESS_FAIL = 0.01, 0.05  # share of held-out examples, beyond the repeat rate
PROJECT = 64


@dataclass
class Overlap:
    pairs: list[tuple[int, int, bool]]  # (held-out row, training row, exact) per copied row
    cross: float  # share of held-out rows with a copy among the training rows
    within: float  # share of training rows with a copy among the other training rows
    val_rows: int
    train_rows: int

    @property
    def excess(self) -> float:
        return self.cross - self.within

    def status(self, warn: float = EXCESS_WARN, fail: float = EXCESS_FAIL) -> str:
        """fail, warn or pass: copies beyond the data's own repeat rate and its noise."""
        noise = 3 * math.sqrt(self.within * (1 - self.within) / max(1, self.val_rows))
        if self.excess <= noise or len(self.pairs) < 2:
            return "pass"
        if self.excess >= fail:
            return "fail"
        return "warn" if self.excess >= warn else "pass"


def find(train: Any, val: Any, near: float = NEAR) -> Overlap:
    """Copies of ``train`` rows among ``val`` rows (both (N, F) float tensors); a near copy
    is closer than ``near`` times the median held-out-to-training distance."""
    import torch

    train, val = torch.nan_to_num(train), torch.nan_to_num(val)
    seen: dict[bytes, int] = {}
    repeated = 0
    for row, digest in enumerate(_digests(train)):
        repeated += digest in seen
        seen.setdefault(digest, row)
    exact = {row: seen[d] for row, d in enumerate(_digests(val)) if d in seen}
    t, v = _embed(train, val)
    distance = torch.cdist(v, t)
    typical = float(distance.median())
    nearest, partner = distance.min(1)
    close = (nearest <= near * typical).tolist()
    pairs = [
        (row, exact.get(row, int(partner[row])), row in exact)
        for row in range(v.shape[0])
        if row in exact or close[row]
    ]
    inner = torch.cdist(t, t)
    inner.fill_diagonal_(math.inf)
    within = int((inner.min(1).values <= near * typical).sum()) if t.shape[0] > 1 else 0
    within = max(within, 2 * repeated)  # an exact repeat is a pair: both rows have a copy
    rows = max(1, t.shape[0])
    return Overlap(
        pairs, len(pairs) / max(1, v.shape[0]), min(1.0, within / rows), v.shape[0], rows
    )


def _digests(rows: Any) -> list[bytes]:
    data = rows.detach().cpu().contiguous().numpy()
    return [hashlib.blake2b(row.tobytes(), digest_size=16).digest() for row in data]


def _embed(train: Any, val: Any) -> tuple[Any, Any]:
    """Both splits standardised with the training statistics; wide rows projected."""
    import torch

    mean = train.mean(0)
    sd = train.std(0, unbiased=False)
    varying = sd[sd > 0]
    floor = 0.1 * float(varying.median()) if varying.numel() else 1.0
    sd = sd.clamp_min(floor)
    t, v = (train - mean) / sd, (val - mean) / sd
    if t.shape[1] > PROJECT:
        g = torch.Generator().manual_seed(0)
        basis = torch.randn(t.shape[1], PROJECT, generator=g).to(t.device) / math.sqrt(PROJECT)
        t, v = t @ basis, v @ basis
    return t, v
