"""The first training steps, measured for weight-norms and update-ratio: per weight tensor its
norm after each step and each update against a scale that is never zero.

A tensor initialised at zero (a positional embedding, an adaLN-zero or zero-initialised head,
a bias matrix) has no scale of its own: measured against itself, its first update is
infinitely large. Such a tensor, and any that starts under a tenth of the model's typical
weight RMS, is measured against that typical RMS (the median over the weight tensors at
initialisation) instead, as if it had started at a normal scale; when every weight tensor
starts at zero, against 1/sqrt(fan_in), the RMS of a default (LeCun) initialisation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from dlci.checks.base import Context

STEPS = 10
SMALL = 0.1  # under this share of the typical RMS a tensor counts as zero-initialised


@dataclass
class Trajectory:
    norms: dict[str, list[float]] = field(default_factory=dict)  # after 0..STEPS steps
    ratios: dict[str, list[float]] = field(default_factory=dict)  # per step
    reference: dict[str, float] = field(default_factory=dict)  # what growth is measured against
    zero_init: list[str] = field(default_factory=list)
    scale: dict[str, float] = field(default_factory=dict)  # the typical RMS each is held to
    nonfinite: list[str] = field(default_factory=list)  # trainable tensors with inf/NaN
    nonfinite_step: int | None = None  # 0: before the first step

    def growth(self) -> dict[str, float]:
        return {n: v[-1] / self.reference[n] for n, v in self.norms.items()}


def _rms(norm: float, numel: int) -> float:
    return norm / math.sqrt(max(numel, 1))


def typical_rms(weights: dict[str, Any]) -> float | None:
    """The median RMS of the weight tensors that are not zero; None if none is."""
    values = sorted(
        rms
        for p in weights.values()
        if math.isfinite(rms := _rms(float(p.detach().float().norm()), p.numel())) and rms > 0
    )
    return values[len(values) // 2] if values else None


def lecun_rms(p: Any) -> float:
    """1/sqrt(fan_in): the RMS a default initialisation gives a tensor of this shape."""
    return 1.0 / math.sqrt(max(1, p.numel() // max(1, p.shape[0])))


def _nonfinite(params: dict[str, Any]) -> list[str]:
    return sorted(n for n, p in params.items() if not bool(p.detach().isfinite().all()))


def trajectory(ctx: Context) -> Trajectory:
    """STEPS training steps with one optimizer; shared by weight-norms and update-ratio."""
    cached: Trajectory | None = getattr(ctx, "_trajectory", None)
    if cached is not None:
        return cached
    ctx.model.train()
    optimizer = ctx.optimizer()
    params = {n: p for n, p in ctx.model.named_parameters() if p.requires_grad}
    weights = {n: p for n, p in params.items() if p.ndim > 1}
    result, typical = Trajectory(), typical_rms(weights)
    floors: dict[str, float] = {}
    for n, p in weights.items():
        norm, root = float(p.detach().float().norm()), math.sqrt(max(p.numel(), 1))
        result.norms[n], result.ratios[n] = [norm], []
        scale = typical if typical is not None else lecun_rms(p)
        result.scale[n] = scale
        small = not norm >= SMALL * scale * root  # NaN counts as small
        if small:
            result.zero_init.append(n)
        result.reference[n] = scale * root if small else norm
        floors[n] = scale * root * (1.0 if small else SMALL)
    result.nonfinite = _nonfinite(params)
    if result.nonfinite:
        result.nonfinite_step = 0
    for step in range(1, STEPS + 1):
        before = {n: p.detach().clone() for n, p in weights.items()}
        ctx.step(ctx.model, optimizer)
        for n, p in weights.items():
            now = p.detach()
            result.norms[n].append(float(now.float().norm()))
            update = float((now - before[n]).float().norm())
            result.ratios[n].append(update / max(float(before[n].float().norm()), floors[n]))
        if result.nonfinite_step is None and (found := _nonfinite(params)):
            result.nonfinite, result.nonfinite_step = found, step
    ctx._trajectory = result  # type: ignore[attr-defined]
    return result
