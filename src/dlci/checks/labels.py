"""label-alignment: do the labels belong to their inputs? (Its training helpers serve leakage
too: the true-label copy is scored after 20 steps for it.)"""

from __future__ import annotations

import copy
import itertools
from typing import Any

from dlci.checks.base import FAIL, PASS, SKIP, WARN, CheckResult, Context
from dlci.memorization.batching import call_model

CONTROL_STEPS = 60  # training steps for each arm of the shuffled-label control
LEAKAGE_STEPS = 20  # "very little training"
EVAL_BATCHES = 8


def train_batches(ctx: Context, count: int) -> list[Any]:
    """``count`` training batches, cycling the loader's first ones."""
    batches = ctx.loader_batches(ctx.target.train_loader, count)
    return list(itertools.islice(itertools.cycle(batches), count)) if batches else []


def val_batches(ctx: Context) -> list[Any]:
    return ctx.loader_batches(ctx.target.val_loader, EVAL_BATCHES)


def evaluate(ctx: Context, model: Any, batches: list[Any]) -> tuple[float, float | None]:
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


def trained_copy(
    ctx: Context, batches: list[Any], score_at: tuple[int, list[Any]] | None = None
) -> Any:
    """A copy of the model trained on ``batches``; ``score_at`` (steps, held-out batches)
    also scores it after that many steps, for leakage (ctx.shared["early-score"])."""
    model = copy.deepcopy(ctx.model)
    model.train()
    optimizer = ctx.optimizer(model)
    for step, batch in enumerate(batches, 1):
        ctx.step(model, optimizer, batch)
        if score_at is not None and step == score_at[0]:
            ctx.shared["early-score"] = _score_between_steps(ctx, model, score_at[1])
    return model


def _score_between_steps(ctx: Context, model: Any, val: list[Any]) -> tuple[float, float | None]:
    """Held-out loss and accuracy mid-training; the training after it goes on as without it."""
    import torch

    state = torch.get_rng_state()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    score = evaluate(ctx, model, val)
    torch.set_rng_state(state)
    if cuda is not None:
        torch.cuda.set_rng_state_all(cuda)
    model.train()
    return score


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
    batches = train_batches(ctx, CONTROL_STEPS)
    generator = torch.Generator().manual_seed(0)
    shuffled = []
    for inputs, targets in batches:
        order = torch.randperm(targets.shape[0], generator=generator).to(targets.device)
        shuffled.append((inputs, targets[order]))
    val = val_batches(ctx)
    if not val:
        return CheckResult("label-alignment", SKIP, cause="the val_loader gave no batches")
    scored = (LEAKAGE_STEPS, val) if len(batches) >= LEAKAGE_STEPS else None
    true_loss, true_acc = evaluate(ctx, trained_copy(ctx, batches, scored), val)
    control_loss, control_acc = evaluate(ctx, trained_copy(ctx, shuffled), val)
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
