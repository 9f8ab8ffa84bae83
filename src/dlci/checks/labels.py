"""label-alignment and leakage: do the labels belong to the inputs, and is a score too good?"""

from __future__ import annotations

import copy
import itertools
import math
from typing import Any

from dlci.checks.base import FAIL, PASS, SKIP, WARN, CheckResult, Context
from dlci.memorization.batching import call_model

CONTROL_STEPS = 60  # training steps for each arm of the shuffled-label control
LEAKAGE_STEPS = 20  # "very little training"
EVAL_BATCHES = 8


def _train_batches(ctx: Context, count: int) -> list[Any]:
    """``count`` training batches, cycling the loader's first ones."""
    batches = ctx.loader_batches(ctx.target.train_loader, count)
    return list(itertools.islice(itertools.cycle(batches), count)) if batches else []


def _val_batches(ctx: Context) -> list[Any]:
    return ctx.loader_batches(ctx.target.val_loader, EVAL_BATCHES)


def _evaluate(ctx: Context, model: Any, batches: list[Any]) -> tuple[float, float | None]:
    """Mean validation loss, and accuracy for classification."""
    import torch

    model.eval()
    losses, correct, total = [], 0, 0
    with torch.no_grad():
        for batch in batches:
            if ctx.target.eval_step is not None:
                outputs = ctx.target.eval_step(model, batch)
            else:
                outputs = call_model(model, batch[0])
            losses.append(float(ctx.target.loss_fn(outputs, batch[1])))  # type: ignore[misc]
            if ctx.is_classification() and isinstance(outputs, torch.Tensor) and outputs.ndim == 2:
                correct += int((outputs.argmax(dim=1) == batch[1]).sum())
                total += int(batch[1].shape[0])
    return sum(losses) / len(losses), (correct / total if total else None)


def _trained_copy(ctx: Context, batches: list[Any]) -> Any:
    model = copy.deepcopy(ctx.model)
    model.train()
    optimizer = ctx.optimizer(model)
    for batch in batches:
        ctx.step(model, optimizer, batch)
    return model


def _needs(ctx: Context, check: str) -> CheckResult | None:
    if ctx.target.val_loader is None:
        return CheckResult(check, SKIP, cause="no val_loader: held-out data is needed")
    if ctx.target.loss_fn is None:
        return CheckResult(check, SKIP, cause="no loss_fn to score held-out data with")
    return None


def label_alignment(ctx: Context) -> CheckResult:
    """Shuffled-label control: true labels must beat shuffled labels on held-out data."""
    import torch

    missing = _needs(ctx, "label-alignment")
    if missing:
        return missing
    batches = _train_batches(ctx, CONTROL_STEPS)
    generator = torch.Generator().manual_seed(0)
    shuffled = []
    for inputs, targets in batches:
        order = torch.randperm(targets.shape[0], generator=generator).to(targets.device)
        shuffled.append((inputs, targets[order]))
    val = _val_batches(ctx)
    true_loss, true_acc = _evaluate(ctx, _trained_copy(ctx, batches), val)
    control_loss, control_acc = _evaluate(ctx, _trained_copy(ctx, shuffled), val)
    measured = f"held-out loss {true_loss:.3g} with true labels, {control_loss:.3g} with shuffled"
    if true_acc is not None and control_acc is not None:
        measured += f" (accuracy {true_acc:.0%} vs {control_acc:.0%})"
    expected = "true labels clearly better (loss at least 10% lower)"
    details = {
        "true_loss": true_loss,
        "shuffled_loss": control_loss,
        "true_accuracy": true_acc,
        "shuffled_accuracy": control_acc,
        "steps": len(batches),
    }
    gain = 1 - true_loss / control_loss if control_loss > 0 else 0.0
    if gain >= 0.1:
        return CheckResult("label-alignment", PASS, measured, expected, details=details)
    return CheckResult(
        "label-alignment",
        FAIL if gain < 0.02 else WARN,
        measured,
        expected,
        details=details,
        cause="training on the true labels generalises no better than on shuffled ones: the "
        "labels do not belong to their inputs (or the task is not learnable yet)",
        fix="check that inputs and labels are indexed together (a sort, a shuffle or a join that "
        "touched only one of them)",
    )


def leakage(ctx: Context) -> CheckResult:
    """A near-perfect held-out score after a few steps, or a start far below chance."""
    import torch

    missing = _needs(ctx, "leakage")
    if missing:
        return missing
    val = _val_batches(ctx)
    model = _trained_copy(ctx, _train_batches(ctx, LEAKAGE_STEPS))
    loss, accuracy = _evaluate(ctx, model, val)
    if accuracy is not None:
        classes = ctx.target.num_classes or 2
        measured = f"held-out accuracy {accuracy:.1%} after {LEAKAGE_STEPS} steps"
        expected = "well below 99% this early"
        suspicious = accuracy >= 0.99 and classes >= 2
    else:
        targets = torch.cat([b[1].float().flatten() for b in val])
        variance = float(targets.var()) if targets.numel() > 1 else 0.0
        if variance <= 0:
            return CheckResult("leakage", SKIP, cause="the held-out targets do not vary")
        ratio = loss / variance
        measured = f"held-out loss {ratio:.2%} of the targets' variance after {LEAKAGE_STEPS} steps"
        expected = "well above 1% this early"
        suspicious = ratio < 0.01 and math.isfinite(ratio)
    if not suspicious:
        return CheckResult("leakage", PASS, measured, expected)
    return CheckResult(
        "leakage",
        FAIL,
        measured,
        expected,
        cause="the held-out score is near perfect after almost no training: the inputs likely "
        "contain the label (a leaked feature, an ID, or validation data also in training)",
        fix="look for a feature derived from the target, and for overlap between the splits",
    )
