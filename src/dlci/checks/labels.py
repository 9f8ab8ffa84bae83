"""label-alignment: do the labels belong to their inputs? (Its training helpers serve leakage
too: the true-label copy is scored after 20 steps for it, with the fit of its outputs.)"""

from __future__ import annotations

import copy
import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dlci.checks.base import FAIL, PASS, SKIP, WARN, CheckResult, Context, fmt
from dlci.training.batching import call_model

CONTROL_STEPS = 60  # training steps for each arm of the shuffled-label control
LEAKAGE_STEPS = 20  # "very little training"
EVAL_BATCHES = 8
AUC_COLUMNS = 256  # 0/1 label columns scored for the AUC, at most


@dataclass
class Score:
    """A model's held-out score: the mean loss, accuracy for classification, and how well the
    outputs fit the targets where the outputs are predictions of them (R^2) or scores of 0/1
    labels (AUC); ``no_fit`` says why there is no fit."""

    loss: float
    accuracy: float | None = None
    fit: float | None = None
    fit_name: str = ""
    no_fit: str = ""


def train_batches(ctx: Context, count: int) -> list[Any]:
    """``count`` training batches, cycling the loader's first ones."""
    batches = ctx.loader_batches(ctx.target.train_loader, count)
    return list(itertools.islice(itertools.cycle(batches), count)) if batches else []


def val_batches(ctx: Context) -> list[Any]:
    return ctx.loader_batches(ctx.target.val_loader, EVAL_BATCHES)


def evaluate(ctx: Context, model: Any, batches: list[Any]) -> Score:
    """Mean validation loss, accuracy for classification, else the fit of the outputs."""
    import torch

    model.eval()
    losses, correct, total = [], 0, 0
    classification = ctx.is_classification()
    pairs: list[tuple[Any, Any]] = []
    no_fit = ""
    with torch.no_grad():
        for batch in batches:
            if ctx.target.eval_step is not None:
                outputs = ctx.target.eval_step(model, batch)
            else:
                outputs = call_model(model, batch[0])
            losses.append(float(ctx.target.loss_fn(outputs, batch[1])))  # type: ignore[misc]
            outputs = _scores(outputs)
            if classification and isinstance(outputs, torch.Tensor) and outputs.ndim == 2:
                correct += int((outputs.argmax(dim=1) == batch[1]).sum())
                total += int(batch[1].shape[0])
            elif not classification and not no_fit:
                pair = _as_columns(outputs, batch[1])
                if isinstance(pair, str):
                    no_fit = pair
                else:
                    pairs.append(pair)
    score = Score(sum(losses) / len(losses), correct / total if total else None)
    if classification:
        if not total:
            score.no_fit = "the outputs are not (N, classes) scores of the class labels"
        return score
    if no_fit:
        score.no_fit = no_fit
    elif pairs:
        score.fit, score.fit_name, score.no_fit = _fit(pairs)
    return score


def _scores(outputs: Any) -> Any:
    """The tensor of scores in a model's outputs: the outputs, or their ``logits`` (as a
    Transformers ``ModelOutput`` holds them)."""
    import torch

    if isinstance(outputs, torch.Tensor):
        return outputs
    logits = outputs.get("logits") if isinstance(outputs, Mapping) else None
    logits = logits if logits is not None else getattr(outputs, "logits", None)
    return logits if isinstance(logits, torch.Tensor) else outputs


def _as_columns(outputs: Any, targets: Any) -> tuple[Any, Any] | str:
    """Outputs and targets as (N, K) float columns when the outputs hold one value per target
    value, or why they cannot be compared with the targets."""
    import torch

    if not isinstance(outputs, torch.Tensor) or not isinstance(targets, torch.Tensor):
        return "the outputs are not one tensor"
    if not targets.is_floating_point():
        return "the targets are class indices and num_classes is not given"
    n = targets.shape[0] if targets.ndim else 1
    if outputs.numel() != targets.numel() or (outputs.shape[0] if outputs.ndim else 1) != n:
        return (
            f"the outputs {tuple(outputs.shape)} are not one prediction per target value "
            f"{tuple(targets.shape)}"
        )
    return outputs.detach().reshape(n, -1).float(), targets.detach().reshape(n, -1).float()


def _fit(pairs: list[Any]) -> tuple[float | None, str, str]:
    """(fit, its name, why none): the AUC of outputs scoring 0/1 labels (logits or
    probabilities alike, as it reads only their order), else the R^2 of outputs predicting
    the targets."""
    import torch

    outputs = torch.cat([p[0] for p in pairs])
    targets = torch.cat([p[1] for p in pairs])
    if not bool(torch.isfinite(outputs).all()):
        return None, "", "the outputs are not finite"
    if bool(((targets == 0) | (targets == 1)).all()):
        positives = targets.sum(dim=0)
        both = [k for k in range(targets.shape[1]) if 0 < positives[k] < targets.shape[0]]
        if not both:
            return None, "", "every held-out label column holds one value only"
        aucs = [_auc(outputs[:, k], targets[:, k]) for k in both[:AUC_COLUMNS]]
        return sum(aucs) / len(aucs), "AUC", ""
    total = float(((targets - targets.mean(dim=0)) ** 2).sum())
    if total <= 0:
        return None, "", "the held-out targets do not vary"
    return 1 - float(((outputs - targets) ** 2).sum()) / total, "R^2", ""


def _auc(scores: Any, labels: Any) -> float:
    """The probability that a positive scores above a negative (ties count half): the
    Mann-Whitney U over both counts."""
    import torch

    order = scores.argsort()
    _, inverse, counts = torch.unique_consecutive(
        scores[order], return_inverse=True, return_counts=True
    )
    ranks = (counts.cumsum(0) - (counts - 1) / 2)[inverse]  # average ranks of tied scores
    positive = labels[order] > 0.5
    n1 = int(positive.sum())
    n0 = int(positive.numel()) - n1
    return (float(ranks[positive].sum()) - n1 * (n1 + 1) / 2) / (n1 * n0)


NEVER_TRAINED = 1e-6  # weights moved by less than this share of their norm: no training at all


def trained_copy(
    ctx: Context,
    batches: list[Any],
    score_at: tuple[int, list[Any]] | None = None,
) -> tuple[Any, float]:
    """A copy of the model trained on ``batches`` and its lowest training loss; ``score_at``
    (steps, held-out batches) also scores it after that many steps, for leakage
    (ctx.shared["early-score"])."""
    model = copy.deepcopy(ctx.model)
    model.train()
    optimizer = ctx.optimizer(model)
    lowest = math.inf
    for step, batch in enumerate(batches, 1):
        lowest = min(lowest, ctx.step(model, optimizer, batch))
        if score_at is not None and step == score_at[0]:
            ctx.shared["early-score"] = _score_between_steps(ctx, model, score_at[1])
    return model, lowest


def _score_between_steps(ctx: Context, model: Any, val: list[Any]) -> Score:
    """The held-out score mid-training; the training after it goes on as without it."""
    import torch

    state = torch.get_rng_state()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    score = evaluate(ctx, model, val)
    torch.set_rng_state(state)
    if cuda is not None:
        torch.cuda.set_rng_state_all(cuda)
    model.train()
    return score


def _shuffled(batches: list[Any]) -> list[Any]:
    """The batches with their labels permuted within each (a fixed seed: the same control)."""
    import torch

    generator = torch.Generator().manual_seed(0)
    shuffled = []
    for inputs, targets in batches:
        order = torch.randperm(targets.shape[0], generator=generator).to(targets.device)
        shuffled.append((inputs, targets[order]))
    return shuffled


AFTER_MEMORIZE = (
    "memorize failed (the training loop cannot overfit one batch), so two copies trained on "
    "true and shuffled labels would tie whatever the labels; fix that first"
)


def _unjudged(why: str, details: dict[str, Any] | None = None) -> CheckResult:
    """No verdict: the check's premise (a loop that learns) did not hold."""
    return CheckResult(
        "label-alignment", SKIP, cause=f"could not judge: {why}", details=details or {}
    )


def _moved(before: Any, after: Any) -> float:
    """How far training moved the weights: the norm of the change over the norm before."""
    import torch

    change = total = 0.0
    with torch.no_grad():
        for old, new in zip(before.parameters(), after.parameters(), strict=True):
            change += float(
                (new.detach().float() - old.detach().float().to(new.device)).pow(2).sum()
            )
            total += float(old.detach().float().pow(2).sum())
    return math.sqrt(change) / max(math.sqrt(total), 1e-12)


def _needs(ctx: Context, check: str) -> CheckResult | None:
    if ctx.target.val_loader is None:
        return CheckResult(check, SKIP, cause="no val_loader: held-out data is needed")
    if ctx.target.loss_fn is None:
        return CheckResult(check, SKIP, cause="no loss_fn to score held-out data with")
    return None


def label_alignment(ctx: Context) -> CheckResult:
    """Shuffled-label control: true labels must beat shuffled labels on held-out data."""
    if missing := _needs(ctx, "label-alignment"):
        return missing
    batches = train_batches(ctx, CONTROL_STEPS)
    val = val_batches(ctx)
    if not val:
        return CheckResult("label-alignment", SKIP, cause="the val_loader gave no batches")
    scored = (LEAKAGE_STEPS, val) if len(batches) >= LEAKAGE_STEPS else None
    if ctx.shared.get("memorize") is False:  # an earlier rung: the loop cannot learn at all
        return _unjudged(AFTER_MEMORIZE)
    model, true_lowest = trained_copy(ctx, batches, scored)
    true = evaluate(ctx, model, val)
    moved = _moved(ctx.model, model)
    if moved < NEVER_TRAINED:  # the premise failed: copies that never trained say nothing
        return _unjudged(
            f"the copy trained on the true labels for {len(batches)} steps did not change (its "
            f"weights moved by {moved:.1e} of their norm): the optimizer updates nothing (does "
            "its factory use the parameters it is given? see optimizer-coverage, lr-range)",
            {"weights_moved": moved, "true_loss": true.loss, "steps": len(batches)},
        )
    model, shuffled_lowest = trained_copy(ctx, _shuffled(batches))
    control = evaluate(ctx, model, val)
    floor = min(0.0, true_lowest, shuffled_lowest, true.loss)
    measured = f"held-out loss {fmt(true.loss)} with true labels, {fmt(control.loss)} with shuffled"
    if true.accuracy is not None and control.accuracy is not None:
        measured += f" (accuracy {true.accuracy:.0%} vs {control.accuracy:.0%})"
    warn = ctx.policy.threshold("label-alignment", "warn-gain")
    fail = ctx.policy.threshold("label-alignment", "fail-gain")
    expected = f"true labels clearly better (loss at least {warn:.0%} lower)"
    if floor < 0:  # no floor at zero (a likelihood): the lowest loss seen stands in for it
        measured += f"; the loss goes below zero: floor taken at the lowest seen, {fmt(floor)}"
        expected = (
            f"true labels clearly better ({warn:.0%} of the way from shuffled down to the lowest)"
        )
    span = control.loss - floor
    gain = (control.loss - true.loss) / span if span > 0 else 0.0
    gain = gain if math.isfinite(gain) else 0.0
    details = {
        "true_loss": true.loss,
        "shuffled_loss": control.loss,
        "floor": floor,
        "gain": gain,
        "true_accuracy": true.accuracy,
        "shuffled_accuracy": control.accuracy,
        "steps": len(batches),
    }
    if gain >= warn:
        return CheckResult("label-alignment", PASS, measured, expected, details=details)
    return CheckResult(
        "label-alignment",
        FAIL if gain < fail else WARN,
        measured,
        expected,
        details=details,
        cause="training on the true labels generalises no better than on shuffled ones: the "
        "labels do not belong to their inputs (or the task is not learnable yet)",
        fix="check that inputs and labels are indexed together (a sort, a shuffle or a join that "
        "touched only one of them)",
    )
