"""initial-loss and loss-broadcast: is the loss computed on what you think it is?"""

from __future__ import annotations

import math
from typing import Any

from dlci.checks.base import FAIL, PASS, SKIP, WARN, CheckResult, Context, fmt
from dlci.training.batching import score_candidates

_BOUNDS = ("warn-low", "warn-high", "fail-low", "fail-high")  # times ln C


def initial_loss(ctx: Context) -> CheckResult:
    import torch

    classes, note = ctx.classes()
    if not classes:
        return CheckResult("initial-loss", SKIP, cause="num_classes is not given")
    if not ctx.is_classification():
        return CheckResult("initial-loss", SKIP, cause="the targets are not class indices")
    if ctx.target.loss_fn is None:
        return CheckResult("initial-loss", SKIP, cause="no loss_fn to measure the loss with")
    ctx.model.eval()
    with torch.no_grad():
        outputs = ctx.evaluate()  # the user's eval_step when given, as the loss is scored
        loss = float(ctx.target.loss_fn(outputs, ctx.batch[1]))
    expected = math.log(classes)
    bound = {key: ctx.policy.threshold("initial-loss", key) for key in _BOUNDS}
    measured = f"{loss:.3f}" + (f" ({note}: judged against {classes})" if note else "")
    band = f"{fmt(bound['warn-low'])}-{fmt(bound['warn-high'])}x"
    want = f"about ln {classes} = {expected:.3f} ({band})"
    if _looks_like_probabilities(outputs):
        return CheckResult(
            "initial-loss",
            FAIL,
            measured + " on outputs that sum to 1",
            want,
            cause="the model's outputs are probabilities (softmax applied), but the loss "
            "expects logits: gradients shrink and training crawls",
            fix="remove the softmax from forward (CrossEntropyLoss applies log-softmax itself)",
        )
    ratio = loss / expected
    if not bound["warn-low"] <= ratio <= bound["warn-high"]:
        plain = _cross_entropy(outputs, ctx.batch[1], classes)
        if plain is None or not math.isfinite(plain):
            return CheckResult(
                "initial-loss",
                SKIP,
                cause=f"the loss ({loss:.3f}) is not one dl-ci recognises: the outputs hold no "
                "class scores it can take a plain cross-entropy of, so no value at chance is "
                "known for it (a composite or custom loss)",
            )
        if abs(plain - loss) > 0.05 * max(abs(loss), 1e-12):  # a composite or custom loss
            measured = (
                f"{loss:.3f} from the loss, which is not a plain cross-entropy (a composite or "
                f"custom loss: no value at chance is known for it); the outputs' plain "
                f"cross-entropy {plain:.3f}"
                + (f" ({note}: judged against {classes})" if note else "")
            )
            loss, ratio = plain, plain / expected
    if bound["warn-low"] <= ratio <= bound["warn-high"]:
        return CheckResult("initial-loss", PASS, measured, want)
    status = WARN if bound["fail-low"] <= ratio <= bound["fail-high"] else FAIL
    if ratio < 1:
        cause = "the loss starts below chance before any training: labels may leak into the inputs"
        fix = "check that no input feature encodes the label and that the loss sees the output"
    else:
        cause = (
            "the untrained model is confident and wrong: large initial weights or a bad last layer"
        )
        fix = "initialise the last layer small (or zero its bias), check the targets' encoding"
    return CheckResult(
        "initial-loss", status, measured, want, cause=cause, fix=fix, details={"ratio": ratio}
    )


def _cross_entropy(outputs: Any, targets: Any, classes: int) -> float | None:
    """The plain cross-entropy of the outputs' class scores against the labels ((N, C),
    (N, L, C) or dense (N, C, H, W) scores), or None where the scores are not found."""
    import torch
    from torch.nn import functional as F

    if not isinstance(targets, torch.Tensor):
        return None
    for scores in score_candidates(outputs):
        if not isinstance(scores, torch.Tensor) or not scores.is_floating_point():
            continue
        with torch.no_grad():
            if scores.shape[:-1] == targets.shape and scores.shape[-1] == classes:
                flat = scores.reshape(-1, classes).float()
                return float(F.cross_entropy(flat, targets.reshape(-1).long()))
            dense = scores.ndim >= 3 and scores.shape[1] == classes
            if dense and scores.shape[2:] == targets.shape[1:] and len(scores) == len(targets):
                return float(F.cross_entropy(scores.float(), targets.long()))
    return None


def _looks_like_probabilities(outputs: Any) -> bool:
    """Whether the scores sum to 1 over their last dimension, for (N, C) and (N, L, V)
    alike; only where the outputs' scores are not in doubt (one tensor, named logits, or
    the only candidate: a dict of probabilities beside the logits the loss reads is not)."""
    import torch

    found = score_candidates(outputs)
    if len(found) != 1:
        return False
    outputs = found[0]
    if not isinstance(outputs, torch.Tensor) or outputs.ndim < 2 or outputs.shape[-1] < 2:
        return False
    outputs = outputs.reshape(-1, outputs.shape[-1])
    sums = outputs.sum(dim=1)
    return bool(
        outputs.min() >= 0
        and outputs.max() <= 1
        and torch.allclose(sums, torch.ones_like(sums), atol=1e-3)
    )


# elementwise operations whose silent broadcasting turns a loss into nonsense
_ELEMENTWISE = {
    "add",
    "sub",
    "mul",
    "div",
    "true_divide",
    "pow",
    "rsub",
    "sub_",
    "add_",
    "mul_",
    "div_",
    "__add__",
    "__radd__",
    "__sub__",
    "__rsub__",
    "__mul__",
    "__rmul__",
    "__truediv__",
    "__rtruediv__",
    "__pow__",
    "eq",
    "ne",
    "lt",
    "le",
    "gt",
    "ge",
    "__eq__",
    "__ne__",
    "__lt__",
    "__le__",
    "__gt__",
    "__ge__",
    "maximum",
    "minimum",
    "where",
    "mse_loss",
    "l1_loss",
    "smooth_l1_loss",
    "huber_loss",
    "binary_cross_entropy",
    "binary_cross_entropy_with_logits",
    "soft_margin_loss",
    "poisson_nll_loss",
    "gaussian_nll_loss",
    "kl_div",
}


def loss_broadcast(ctx: Context) -> CheckResult:
    """Watch the loss computation (after the model's forward) for broadcasting binary ops."""
    from torch.overrides import TorchFunctionMode

    found: list[str] = []
    after_forward = {"on": False}

    class Watch(TorchFunctionMode):
        def __torch_function__(
            self, func: Any, types: Any, args: Any = (), kwargs: Any = None
        ) -> Any:
            kwargs = kwargs or {}
            if after_forward["on"]:
                name = getattr(func, "__name__", "")
                if name in _ELEMENTWISE:
                    _record(name, [*args, *kwargs.values()], found)
            return func(*args, **kwargs)

    def mark(module: Any, inputs: Any, output: Any) -> None:
        after_forward["on"] = True

    handle = ctx.model.register_forward_hook(mark)
    try:
        ctx.model.train()
        optimizer = ctx.optimizer()
        with Watch():
            if ctx.target.train_step is None:
                outputs = ctx.forward()
                ctx.target.loss_fn(outputs, ctx.batch[1])  # type: ignore[misc]
            else:
                ctx.step(ctx.model, optimizer)
    finally:
        handle.remove()
    expected = "no operand broadcast to a larger shape"
    if not found:
        return CheckResult("loss-broadcast", PASS, "no broadcasting in the loss", expected)
    return CheckResult(
        "loss-broadcast",
        FAIL,
        found[0],
        expected,
        cause="prediction and target shapes broadcast into a larger tensor: the loss compares "
        "every prediction with every target",
        fix="make the shapes equal, e.g. outputs.squeeze(-1) for an (N, 1) output and (N,) target",
        details={"operations": found[:10]},
    )


def _record(name: str, operands: list[Any], found: list[str]) -> None:
    import torch

    tensors = [t for t in operands if isinstance(t, torch.Tensor) and t.ndim > 0]
    if len(tensors) < 2:
        return
    shapes = [tuple(t.shape) for t in tensors[:2]]
    try:
        result = torch.broadcast_shapes(*shapes)  # type: ignore[no-untyped-call]
    except RuntimeError:
        return
    largest = max(math.prod(s) for s in shapes)
    if math.prod(result) > largest:
        found.append(f"{name}: {shapes[0]} with {shapes[1]} -> {tuple(result)}")
