"""activations: dead ReLUs and saturated tanh/sigmoid units."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dlci.checks.base import FAIL, PASS, SKIP, WARN, CheckResult, Context, fmt

EXPECTED = "under 40% dead or saturated units per layer"


def activations(ctx: Context) -> CheckResult:
    watched = _watched(ctx.model)
    if not watched:
        return CheckResult(
            "activations",
            SKIP,
            cause="no ReLU, Tanh or Sigmoid modules (functional calls are not seen)",
        )
    stats = _record(ctx, watched)
    worst_name, worst = max(
        ((n, max(s.get("dead", 0.0), s.get("saturated", 0.0))) for n, s in stats.items()),
        key=lambda pair: pair[1],
    )
    kind = "dead" if "dead" in stats[worst_name] else "saturated"
    measured = f"{worst_name}: {worst:.0%} {kind}"
    details = {n: {k: fmt(v) for k, v in s.items()} for n, s in stats.items()}
    # ReLUs fed only positive inputs (after ReLU and pooling) leave a share of units silent
    # on a small batch at initialisation; that is not yet a dead network
    if worst < 0.4:
        return CheckResult("activations", PASS, measured, EXPECTED, details=details)
    return _verdict(kind, worst, measured, details)


def _kinds() -> tuple[tuple[type, ...], tuple[type, ...]]:
    """The rectifying and the squashing activation modules."""
    from torch import nn

    return (nn.ReLU, nn.ReLU6), (nn.Tanh, nn.Sigmoid, nn.Hardtanh)


def _watched(model: Any) -> list[tuple[str, Any]]:
    relu, squash = _kinds()
    return [(n, m) for n, m in model.named_modules() if isinstance(m, relu + squash)]


def _record(ctx: Context, watched: list[tuple[str, Any]]) -> dict[str, dict[str, float]]:
    """One forward pass in eval mode, recording each watched module's output statistics."""
    import torch

    stats: dict[str, dict[str, float]] = {}
    handles = [m.register_forward_hook(_recorder(n, m, stats)) for n, m in watched]
    try:
        ctx.model.eval()
        with torch.no_grad():
            ctx.forward()
    finally:
        for handle in handles:
            handle.remove()
    return stats


def _recorder(
    name: str, module: Any, stats: dict[str, dict[str, float]]
) -> Callable[[Any, Any, Any], None]:
    from torch import nn

    relu, _ = _kinds()

    def record(mod: Any, inputs: Any, output: Any) -> None:
        out = output.detach().float()
        units = out.transpose(0, 1).reshape(out.shape[1], -1) if out.ndim > 1 else out[None]
        entry = {"mean": float(out.mean()), "std": float(out.std()) if out.numel() > 1 else 0.0}
        if isinstance(module, relu):
            entry["dead"] = float((units.max(dim=1).values <= 0).float().mean())
        elif isinstance(module, nn.Sigmoid):
            entry["saturated"] = float(((out < 0.01) | (out > 0.99)).float().mean())
        else:
            entry["saturated"] = float((out.abs() > 0.99).float().mean())
        stats[name] = entry

    return record


def _verdict(kind: str, worst: float, measured: str, details: dict[str, Any]) -> CheckResult:
    """A warning from 40% dead or saturated units in a layer, a failure from 50%."""
    cause = (
        "ReLU units that never fire pass no gradient and never recover"
        if kind == "dead"
        else "saturated units pass almost no gradient"
    )
    fix = (
        "check the initialisation (Kaiming for ReLU, biases near 0), lower the learning rate, "
        "or use LeakyReLU"
        if kind == "dead"
        else "normalise the inputs, initialise smaller, or add normalization before the activation"
    )
    return CheckResult(
        "activations",
        FAIL if worst >= 0.5 else WARN,
        measured,
        EXPECTED,
        cause=cause,
        fix=fix,
        details=details,
    )
