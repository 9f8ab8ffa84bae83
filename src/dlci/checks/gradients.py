"""zero-grad, grad-flow, weight-norms, update-ratio: what the gradients and the updates do."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from dlci.checks.base import FAIL, PASS, SKIP, WARN, CheckResult, Context, fmt, layer_name

TRAJECTORY_STEPS = 10


def zero_grad(ctx: Context) -> CheckResult:
    """Gradients present before the first backward of a train_step call: accumulation."""
    if ctx.target.train_step is None:
        return CheckResult(
            "zero-grad", SKIP, cause="no train_step: dl-ci's own step zeroes gradients"
        )
    params = [(n, p) for n, p in ctx.model.named_parameters() if p.requires_grad]
    incoming: dict[str, Any] = {}
    leftover: dict[str, float] = {}
    state = {"call": 0}
    seen: set[tuple[int, str]] = set()

    def on_grad(name: str) -> Callable[[Any], None]:
        def hook(grad: Any) -> None:
            incoming[name] = grad.detach().clone()

        return hook

    def after_accumulate(name: str) -> Callable[[Any], None]:
        def hook(param: Any) -> None:
            key = (state["call"], name)
            if key in seen or name not in incoming:
                return  # only the first backward of each call: micro-batching is fine
            seen.add(key)
            rest = (param.grad - incoming[name]).norm().item()
            if state["call"] == 2 and rest > 1e-6 * (1 + incoming[name].norm().item()):
                leftover[name] = rest

        return hook

    handles = []
    for name, p in params:
        p.grad = None
        handles.append(p.register_hook(on_grad(name)))
        handles.append(p.register_post_accumulate_grad_hook(after_accumulate(name)))
    try:
        ctx.model.train()
        optimizer = ctx.optimizer()
        for call in (1, 2):
            state["call"] = call
            ctx.step(ctx.model, optimizer)
    finally:
        for handle in handles:
            handle.remove()
    expected = "no gradient left from the previous call"
    if not leftover:
        return CheckResult("zero-grad", PASS, "gradients start at zero in each call", expected)
    return CheckResult(
        "zero-grad",
        FAIL,
        f"{len(leftover)} of {len(params)} tensors start with last call's gradient",
        expected,
        cause="gradients accumulate across train_step calls: each update uses the sum of all "
        "past gradients",
        fix="call optimizer.zero_grad() at the start of train_step (or after optimizer.step())",
        details={"tensors": sorted(leftover)[:10]},
    )


def _captured_step(ctx: Context) -> dict[str, Any]:
    """One training step; every gradient as it was after backward (the step may zero it)."""
    grads: dict[str, Any] = {}
    handles = [
        p.register_post_accumulate_grad_hook(
            lambda param, name=name: grads.__setitem__(name, param.grad.detach().clone())
        )
        for name, p in ctx.model.named_parameters()
        if p.requires_grad
    ]
    try:
        ctx.model.train()
        ctx.step(ctx.model, ctx.optimizer())
    finally:
        for handle in handles:
            handle.remove()
    return grads


def grad_flow(ctx: Context) -> CheckResult:
    grads = _captured_step(ctx)
    trainable = [(n, p) for n, p in ctx.model.named_parameters() if p.requires_grad]
    none = [n for n, _ in trainable if n not in grads]
    zero = [n for n, g in grads.items() if bool((g == 0).all())]
    bad = [n for n, g in grads.items() if not bool(g.isfinite().all())]
    norms = {n: float(g.norm()) for n, g in grads.items()}
    details = {"grad_norms": {n: fmt(v) for n, v in norms.items()}}
    expected = "every trainable tensor gets a finite, non-zero gradient"
    if bad:
        return CheckResult(
            "grad-flow",
            FAIL,
            f"non-finite gradients in {', '.join(sorted({layer_name(n) for n in bad})[:4])}",
            expected,
            cause="gradients overflow: the loss or an activation produces inf/NaN",
            fix="lower the learning rate, check for log(0) or division by zero, clip gradients",
            details=details,
        )
    if none or zero:
        layers = sorted({layer_name(n) for n in none + zero})
        return CheckResult(
            "grad-flow",
            FAIL,
            f"no gradient reaches {', '.join(layers[:5])}",
            expected,
            cause="those layers never learn: a detached tensor, an unused layer, or dead units "
            "between them and the loss",
            fix="look for .detach(), .data or torch.no_grad() between those layers and the loss; "
            "freeze unused layers with requires_grad=False",
            details={**details, "no_gradient": none, "zero_gradient": zero},
        )
    largest = max(norms.values()) if norms else 0.0
    if largest > 1e3:
        return CheckResult(
            "grad-flow",
            WARN,
            f"largest gradient norm {fmt(largest)}",
            "below 1e3",
            details=details,
            cause="gradients explode",
            fix="lower the learning rate or clip gradients "
            "(the tuning playbook suggests the 90th percentile of observed norms)",
        )
    return CheckResult(
        "grad-flow",
        PASS,
        f"{len(grads)} tensors, largest norm {fmt(largest)}",
        expected,
        details=details,
    )


def _trajectory(ctx: Context) -> dict[str, Any]:
    """Weight norms and update ratios over the first steps; shared by two checks."""
    cached: dict[str, Any] | None = getattr(ctx, "_trajectory", None)
    if cached is not None:
        return cached
    ctx.model.train()
    optimizer = ctx.optimizer()
    weights = {n: p for n, p in ctx.model.named_parameters() if p.requires_grad and p.ndim > 1}
    norms = {n: [float(p.detach().norm())] for n, p in weights.items()}
    ratios: dict[str, list[float]] = {n: [] for n in weights}
    for _ in range(TRAJECTORY_STEPS):
        before = {n: p.detach().clone() for n, p in weights.items()}
        ctx.step(ctx.model, optimizer)
        for n, p in weights.items():
            now = p.detach()
            norms[n].append(float(now.norm()))
            ratios[n].append(float((now - before[n]).norm() / (before[n].norm() + 1e-12)))
    result = {"norms": norms, "ratios": ratios}
    ctx._trajectory = result  # type: ignore[attr-defined]
    return result


def weight_norms(ctx: Context) -> CheckResult:
    norms = _trajectory(ctx)["norms"]
    if not norms:
        return CheckResult("weight-norms", SKIP, cause="no weight matrices to watch")
    growth = {n: (v[-1] / v[0] if v[0] > 0 else math.inf) for n, v in norms.items()}
    worst = max(growth, key=lambda n: growth[n] if math.isfinite(growth[n]) else math.inf)
    value = growth[worst]
    measured = f"{layer_name(worst)} x{fmt(value)} in {TRAJECTORY_STEPS} steps"
    expected = "weights grow at most 3x in the first steps"
    details = {"growth": {layer_name(n): fmt(g) for n, g in growth.items()}}
    if not math.isfinite(value) or any(not math.isfinite(x) for v in norms.values() for x in v):
        return CheckResult(
            "weight-norms",
            FAIL,
            "non-finite weights",
            expected,
            details=details,
            cause="the weights overflowed",
            fix="lower the learning rate",
        )
    if value > 10:
        return CheckResult(
            "weight-norms",
            FAIL,
            measured,
            expected,
            details=details,
            cause="weights grow without bound",
            fix="lower the learning rate; add weight decay or normalization",
        )
    if value > 3:
        return CheckResult(
            "weight-norms",
            WARN,
            measured,
            expected,
            details=details,
            cause="weights grow fast",
            fix="watch the learning rate",
        )
    return CheckResult("weight-norms", PASS, measured, expected, details=details)


def update_ratio(ctx: Context) -> CheckResult:
    ratios = _trajectory(ctx)["ratios"]
    if not ratios:
        return CheckResult("update-ratio", SKIP, cause="no weight matrices to watch")
    medians = {n: sorted(v)[len(v) // 2] for n, v in ratios.items()}
    peaks = {n: max(v) for n, v in ratios.items()}
    high = max(medians, key=lambda n: medians[n] if math.isfinite(medians[n]) else math.inf)
    low = min(medians, key=lambda n: medians[n])
    peak = max(peaks, key=lambda n: peaks[n] if math.isfinite(peaks[n]) else math.inf)
    expected = "about 1e-3 per step (1e-5 to 0.1)"
    details = {
        "median_ratio": {layer_name(n): fmt(r) for n, r in medians.items()},
        "largest_ratio": {layer_name(n): fmt(r) for n, r in peaks.items()},
    }
    top, bottom = medians[high], medians[low]
    # Adam's first steps move every weight by about lr: an update larger than the weight
    # itself is a learning rate orders of magnitude too high, even if later ratios shrink
    if not math.isfinite(peaks[peak]) or peaks[peak] > 1.0 or top > 0.3:
        name, value = (peak, peaks[peak]) if peaks[peak] > 1.0 else (high, top)
        return CheckResult(
            "update-ratio",
            FAIL,
            f"{layer_name(name)}: {fmt(value)}",
            expected,
            details=details,
            cause="each step rewrites much of the weights: the learning rate is far too high",
            fix="lower the learning rate by 10-100x (an LR range test finds a good one)",
        )
    if max(medians.values()) < 1e-7:
        return CheckResult(
            "update-ratio",
            FAIL,
            f"{layer_name(high)}: {fmt(top)}",
            expected,
            details=details,
            cause="the updates do nothing: the learning rate is far too low or no step is applied",
            fix="raise the learning rate; check that optimizer.step() runs",
        )
    if top > 0.1 or bottom < 1e-5:  # Adam at lr 3e-3 moves small layers by a few 1e-2
        which, value = (high, top) if top > 0.1 else (low, bottom)
        return CheckResult(
            "update-ratio",
            WARN,
            f"{layer_name(which)}: {fmt(value)}",
            expected,
            details=details,
            cause="updates are large" if top > 0.1 else "some layer barely moves",
            fix="tune the learning rate (per layer if needed)",
        )
    return CheckResult(
        "update-ratio", PASS, f"{fmt(bottom)} to {fmt(top)}", expected, details=details
    )
