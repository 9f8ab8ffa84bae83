"""zero-grad, grad-flow, weight-norms, update-ratio: what the gradients and the updates do."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dlci.checks.base import FAIL, PASS, SKIP, WARN, CheckResult, Context, fmt, layer_name, number
from dlci.checks.trajectory import STEPS, Trajectory, trajectory

# a tensor behind a zero-initialised one (the last BatchNorm gamma of a residual branch,
# ReZero's alpha, a zero head) gets its first gradient once that one has moved: step 2, or
# step 3 behind two of them (a ReZero branch under a zero head)
FLOW_STEPS = 5
#: the layers whose per-step series the report keeps for the doctor's figures (the first, in order)
SERIES_LAYERS = 64


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


class _Flow:
    """What the gradients did over the first steps of one optimizer."""

    def __init__(self) -> None:
        self.first: dict[str, Any] = {}  # step 1's gradients, as after backward
        self.flowing: dict[str, int] = {}  # the first step with a non-zero gradient
        self.step = 0

    def hook(self, name: str) -> Callable[[Any], None]:
        def after_accumulate(param: Any) -> None:
            grad = _stored(param.grad.detach())
            if self.step == 1:
                self.first[name] = grad.clone()
            if name not in self.flowing and bool((grad != 0).any()):
                self.flowing[name] = self.step

        return after_accumulate


def _stored(grad: Any) -> Any:
    """A gradient's stored values: a sparse one's (an ``Embedding(sparse=True)``'s rows that
    got one), coalesced so a repeated row counts once; sparse tensors have no ``!=`` and no
    ``isfinite``, and their norm is the norm of these values.

    >>> import torch
    >>> sparse = torch.sparse_coo_tensor([[0, 0, 2]], [[1.0], [2.0], [0.0]], (4, 1))
    >>> _stored(sparse).flatten().tolist(), float(_stored(sparse).norm())
    ([3.0, 0.0], 3.0)
    """
    return grad.coalesce().values() if grad.is_sparse else grad


def _captured_steps(ctx: Context, trainable: list[tuple[str, Any]]) -> _Flow:
    """Up to FLOW_STEPS training steps, until every trainable tensor got a gradient."""
    flow = _Flow()
    handles = [p.register_post_accumulate_grad_hook(flow.hook(n)) for n, p in trainable]
    try:
        ctx.model.train()
        optimizer = ctx.optimizer()
        for step in range(1, FLOW_STEPS + 1):
            flow.step = step
            ctx.step(ctx.model, optimizer)
            if len(flow.flowing) == len(trainable):
                break
    finally:
        for handle in handles:
            handle.remove()
    return flow


def grad_flow(ctx: Context) -> CheckResult:
    trainable = [(n, p) for n, p in ctx.model.named_parameters() if p.requires_grad]
    flow = _captured_steps(ctx, trainable)
    grads = flow.first
    never = [n for n, _ in trainable if n not in flow.flowing]
    none = [n for n in never if n not in grads]
    zero = [n for n in never if n in grads]
    bad = [n for n, g in grads.items() if not bool(g.isfinite().all())]
    # in the model's order (the figure reads them input to output), not backward's
    norms = {n: float(grads[n].float().norm()) for n, _ in trainable if n in grads}
    details: dict[str, Any] = {"grad_norms": {n: fmt(v) for n, v in norms.items()}}
    late = sorted(n for n, step in flow.flowing.items() if step > 1)
    if late:
        details["first_gradient_at_a_later_step"] = {n: flow.flowing[n] for n in late}
    expected = f"every trainable tensor gets a finite, non-zero gradient within {FLOW_STEPS} steps"
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
    if never:
        layers = sorted({layer_name(n) for n in never})
        return CheckResult(
            "grad-flow",
            FAIL,
            f"no gradient reaches {', '.join(layers[:5])} in {flow.step} steps",
            expected,
            cause="those layers never learn: a detached tensor, an unused layer, or dead units "
            "between them and the loss",
            fix="look for .detach(), .data or torch.no_grad() between those layers and the loss; "
            "freeze unused layers with requires_grad=False",
            details={**details, "no_gradient": none, "zero_gradient": zero},
        )
    largest = max(norms.values()) if norms else 0.0
    measured = f"{len(trainable)} tensors, largest norm {fmt(largest)}"
    if late:  # behind a zero-initialised tensor: healthy, and worth knowing
        steps = sorted({flow.flowing[n] for n in late})
        when = f"{steps[0]}" if len(steps) == 1 else f"{steps[0]}-{steps[-1]}"
        measured += f"; {len(late)} got their first gradient at step {when}"
    ceiling = ctx.policy.threshold("grad-flow", "warn-norm")
    if largest > ceiling:
        return CheckResult(
            "grad-flow",
            WARN,
            f"largest gradient norm {fmt(largest)}",
            f"below {number(ceiling)}",
            details=details,
            cause="gradients explode",
            fix="lower the learning rate or clip gradients "
            "(the tuning playbook suggests the 90th percentile of observed norms)",
        )
    return CheckResult("grad-flow", PASS, measured, expected, details=details)


def _nonfinite_result(check: str, path: Trajectory, expected: str) -> CheckResult:
    """The weights hold inf or NaN: say since when, and nothing the numbers do not show."""
    layers = ", ".join(sorted({layer_name(n) for n in path.nonfinite})[:4])
    if path.nonfinite_step == 0:
        measured = f"non-finite weights before the first step: {layers}"
        cause = (
            "the model starts with inf or NaN weights: the initialisation or a loaded checkpoint"
        )
        fix = "check the initialisation code and the checkpoint the model loads"
    else:
        measured = f"non-finite weights after step {path.nonfinite_step}: {layers}"
        cause = "the weights became inf or NaN in the first steps: an update overflowed"
        fix = "lower the learning rate; look for inf/NaN in the loss (log(0), division by zero)"
    return CheckResult(check, FAIL, measured, expected, cause=cause, fix=fix)


def _scale_note(path: Trajectory, name: str) -> str:
    if name not in path.zero_init:
        return ""
    return f" (starts near zero: against a typical weight RMS, {fmt(path.scale[name])})"


def weight_norms(ctx: Context) -> CheckResult:
    path = trajectory(ctx)
    warn = ctx.policy.threshold("weight-norms", "warn-growth")
    fail = ctx.policy.threshold("weight-norms", "fail-growth")
    expected = f"weights grow at most {fmt(warn)}x in the first steps"
    if path.nonfinite:
        return _nonfinite_result("weight-norms", path, expected)
    if not path.norms:
        return CheckResult("weight-norms", SKIP, cause="no trainable weight matrices to watch")
    growth = path.growth()
    worst = max(growth, key=lambda n: growth[n])
    value = growth[worst]
    measured = f"{layer_name(worst)} x{fmt(value)} in {STEPS} steps{_scale_note(path, worst)}"
    details: dict[str, Any] = {"growth": {layer_name(n): fmt(g) for n, g in growth.items()}}
    # each layer's norm after 0..STEPS steps against what growth is measured by, for the figure
    details["norm_by_step"] = {
        layer_name(n): [float(f"{v / path.reference[n]:.4g}") for v in values]
        for n, values in list(path.norms.items())[:SERIES_LAYERS]
    }
    if path.zero_init:
        details["zero_initialised"] = {n: fmt(path.scale[n]) for n in path.zero_init}
    if value > fail:
        return CheckResult(
            "weight-norms",
            FAIL,
            measured,
            expected,
            details=details,
            cause="weights grow without bound",
            fix="lower the learning rate; add weight decay or normalization",
        )
    if value > warn:
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


_RATIO_BOUNDS = ("warn-low", "fail-low", "warn-high", "fail-high", "fail-largest")


def update_ratio(ctx: Context) -> CheckResult:
    path = trajectory(ctx)
    bound = {key: ctx.policy.threshold("update-ratio", key) for key in _RATIO_BOUNDS}
    expected = f"about 1e-3 per step ({number(bound['warn-low'])} to {number(bound['warn-high'])})"
    if path.nonfinite:
        return _nonfinite_result("update-ratio", path, expected)
    ratios = path.ratios
    if not ratios:
        return CheckResult("update-ratio", SKIP, cause="no trainable weight matrices to watch")
    medians = {n: sorted(v)[len(v) // 2] for n, v in ratios.items()}
    peaks = {n: max(v) for n, v in ratios.items()}
    details: dict[str, Any] = {
        "median_ratio": {layer_name(n): fmt(r) for n, r in medians.items()},
        "largest_ratio": {layer_name(n): fmt(r) for n, r in peaks.items()},
        # each layer's ratio at every step, for the figure
        "ratio_by_step": {
            layer_name(n): [float(f"{r:.4g}") for r in v]
            for n, v in list(ratios.items())[:SERIES_LAYERS]
        },
    }
    if path.zero_init:
        details["zero_initialised"] = {n: fmt(path.scale[n]) for n in path.zero_init}
    found = _ratio_finding(medians, peaks, bound)
    adaptive = _adaptive(ctx)
    if adaptive and found is not None and found[0] == WARN:
        details["adaptive_optimizer"] = adaptive
        found = None  # its step size is its own: only the failure bounds say anything
    if found is None:
        top, bottom = max(medians.values()), min(medians.values())
        measured = f"{fmt(bottom)} to {fmt(top)}"
        if adaptive:
            measured += (
                f" ({adaptive} sets its own step size, not lr x gradient: only the failure "
                "bounds apply)"
            )
        return CheckResult("update-ratio", PASS, measured, expected, details=details)
    status, name, value, cause, fix = found
    note = "" if cause.startswith("the updates do nothing") else _scale_note(path, name)
    return CheckResult(
        "update-ratio",
        status,
        f"{layer_name(name)}: {fmt(value)}{note}",
        expected,
        details=details,
        cause=cause,
        fix=fix,
    )


# optimizers whose step is not lr x (a normalised) gradient: their first updates are sized by
# accumulators that start at zero (Adadelta, whose lr 1.0 is a scale, not a rate), by the
# gradient's sign (Rprop), by the weights' own scale (Adafactor's relative step), or by a
# step size they estimate (Prodigy, D-Adaptation, schedule-free)
ADAPTIVE = ("Adadelta", "Rprop", "Adafactor", "Prodigy", "DAdapt", "ScheduleFree")


def _adaptive(ctx: Context) -> str:
    """The optimizer's class name when it is one of ADAPTIVE (or derives from one), else ``""``."""
    try:
        optimizer = ctx.optimizer()
    except Exception:  # the trajectory's own optimizer was built: this one is only a name
        return ""
    for klass in type(optimizer).__mro__:
        if klass.__name__.startswith(ADAPTIVE):
            return type(optimizer).__name__
    return ""


def _ratio_finding(
    medians: dict[str, float], peaks: dict[str, float], bound: dict[str, float]
) -> tuple[str, str, float, str, str] | None:
    """(status, tensor, ratio, cause, fix) of the worst update ratio outside the bounds."""
    high = max(medians, key=lambda n: medians[n])
    low = min(medians, key=lambda n: medians[n])
    peak = max(peaks, key=lambda n: peaks[n])
    top, bottom = medians[high], medians[low]
    # Adam's first steps move every weight by about lr: an update larger than the weight
    # itself is a learning rate orders of magnitude too high, even if later ratios shrink
    if peaks[peak] > bound["fail-largest"] or top > bound["fail-high"]:
        name, value = (peak, peaks[peak]) if peaks[peak] > bound["fail-largest"] else (high, top)
        return (
            FAIL,
            name,
            value,
            "each step rewrites much of the weights: the learning rate is far too high",
            "lower the learning rate by 10-100x (an LR range test finds a good one)",
        )
    if top < bound["fail-low"]:
        return (
            FAIL,
            high,
            top,
            "the updates do nothing: the learning rate is far too low or no step is applied",
            "raise the learning rate; check that optimizer.step() runs",
        )
    # Adam at lr 3e-3 moves small layers by a few 1e-2
    if top > bound["warn-high"] or bottom < bound["warn-low"]:
        which, value = (high, top) if top > bound["warn-high"] else (low, bottom)
        return (
            WARN,
            which,
            value,
            "updates are large" if top > bound["warn-high"] else "some layer barely moves",
            "tune the learning rate (per layer if needed)",
        )
    return None
