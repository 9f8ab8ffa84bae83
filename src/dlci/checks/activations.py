"""activations: dead ReLUs and saturated tanh/sigmoid units."""

from __future__ import annotations

from typing import Any

from dlci.checks.base import FAIL, PASS, SKIP, WARN, CheckResult, Context, fmt


def activations(ctx: Context) -> CheckResult:
    import torch
    from torch import nn

    relu = (nn.ReLU, nn.ReLU6)
    squash = (nn.Tanh, nn.Sigmoid, nn.Hardtanh)
    watched = [(n, m) for n, m in ctx.model.named_modules() if isinstance(m, relu + squash)]
    if not watched:
        return CheckResult(
            "activations",
            SKIP,
            cause="no ReLU, Tanh or Sigmoid modules (functional calls are not seen)",
        )
    stats: dict[str, dict[str, Any]] = {}

    def hook(name: str, module: Any):  # type: ignore[no-untyped-def]
        def record(mod, inputs, output):  # type: ignore[no-untyped-def]
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

    handles = [m.register_forward_hook(hook(n, m)) for n, m in watched]
    try:
        ctx.model.eval()
        with torch.no_grad():
            ctx.forward()
    finally:
        for handle in handles:
            handle.remove()
    worst_name, worst = max(
        ((n, max(s.get("dead", 0.0), s.get("saturated", 0.0))) for n, s in stats.items()),
        key=lambda pair: pair[1],
    )
    kind = "dead" if "dead" in stats[worst_name] else "saturated"
    measured = f"{worst_name}: {worst:.0%} {kind}"
    expected = "under 40% dead or saturated units per layer"
    details = {n: {k: fmt(v) for k, v in s.items()} for n, s in stats.items()}
    # ReLUs fed only positive inputs (after ReLU and pooling) leave a share of units silent
    # on a small batch at initialisation; that is not yet a dead network
    if worst < 0.4:
        return CheckResult("activations", PASS, measured, expected, details=details)
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
        expected,
        cause=cause,
        fix=fix,
        details=details,
    )
