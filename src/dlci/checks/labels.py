"""label-alignment: do the labels belong to their inputs? (Its training helpers serve leakage
too: the true-label copy is scored after 20 steps for it, with the fit of its outputs.)"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any

from dlci.checks.base import FAIL, PASS, SKIP, WARN, CheckResult, Context, fmt
from dlci.training.batching import logits_of, tree_map
from dlci.training.copying import model_copy
from dlci.training.draws import Draws

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


def evaluate(ctx: Context, model: Any, batches: list[Any], draws: Any = None) -> Score:
    """Mean validation loss, accuracy for classification, else the fit of the outputs;
    ``draws`` replayed first, so two models scored on them meet the same random draws."""
    import torch

    if draws is not None:
        draws.replay()
    model.eval()
    losses, correct, total = [], 0, 0
    classification = ctx.is_classification()
    pairs: list[tuple[Any, Any]] = []
    no_fit = ""
    with torch.no_grad():
        for batch in batches:
            outputs = ctx.evaluate(batch, model)
            losses.append(float(ctx.target.loss_fn(outputs, batch[1])))  # type: ignore[misc]
            outputs = _scores(outputs, ctx.classes()[0] if classification else None)
            labels = batch[1]
            if (
                classification
                and isinstance(outputs, torch.Tensor)
                and isinstance(labels, torch.Tensor)
                and outputs.ndim >= 2
                and outputs.shape[:-1] == labels.shape  # (N, C) or per position (N, L, C)
            ):
                kept = labels >= 0  # a negative label is an ignore index
                correct += int((outputs.argmax(dim=-1) == labels)[kept].sum())
                total += int(kept.sum())
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


def _scores(outputs: Any, classes: int | None = None) -> Any:
    """The tensor of scores in a model's outputs (training/batching.py's ``logits_of``)."""
    return logits_of(outputs, classes=classes)


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
EXTENDED_STEPS = 240  # the most each copy trains when 60 steps gave no pass (counted in
# steps, never in seconds: the verdict is the same on a loaded machine and an idle one)
FIT_PREMISE = 0.1  # how far the true-label copy must fit its own batches for a failure to count


class Arm:
    """One copy of the model in training, its optimizer kept, so it can train on."""

    def __init__(self, ctx: Context) -> None:
        self.model = model_copy(ctx.model)
        self.model.train()
        self.optimizer = ctx.optimizer(self.model)
        self.losses: list[float] = []

    def train(
        self, ctx: Context, batches: list[Any], score_at: tuple[int, list[Any]] | None = None
    ) -> Arm:
        self.model.train()
        for batch in batches:
            self.losses.append(ctx.step(self.model, self.optimizer, batch))
            if score_at is not None and len(self.losses) == score_at[0]:
                ctx.shared["early-score"] = _score_between_steps(ctx, self.model, score_at[1])
        return self

    @property
    def lowest(self) -> float:
        return min(self.losses, default=math.inf)


def trained_copy(
    ctx: Context,
    batches: list[Any],
    score_at: tuple[int, list[Any]] | None = None,
) -> tuple[Any, float]:
    """A copy of the model trained on ``batches`` and its lowest training loss; ``score_at``
    (steps, held-out batches) also scores it after that many steps, for leakage
    (ctx.shared["early-score"])."""
    arm = Arm(ctx).train(ctx, batches, score_at)
    return arm.model, arm.lowest


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


ONE_BATCH_STEPS = 60  # the probe of a loop that learns, when memorize did not run before
ONE_BATCH_FALL = 0.25  # the share of the way to the floor its loss must fall


def _learns(ctx: Context, batch: Any) -> tuple[bool, str]:
    """Whether the loop fits one batch at its rate, whatever its labels say: memorize's
    verdict when it ran before (it failing keeps this check from running), else a copy
    trained ONE_BATCH_STEPS steps on ``batch``, whose loss there must fall a quarter of the
    way from its start to the floor (a loop that learns nothing at its rate moves it by a
    few percent: a tiny BERT at 5e-5 by 0.4%)."""
    if ctx.shared.get("memorize") is True:
        return True, "memorize passed: it overfits one batch"
    import torch

    state = torch.get_rng_state()
    arm = Arm(ctx)
    start = evaluate(ctx, arm.model, [batch]).loss
    arm.train(ctx, [batch] * ONE_BATCH_STEPS)
    end = evaluate(ctx, arm.model, [batch]).loss
    torch.set_rng_state(state)
    floor = min(0.0, end, arm.lowest)
    learns = start > floor and start - end >= ONE_BATCH_FALL * (start - floor)
    verb = "learns" if learns else "does not learn"
    return learns, (
        f"a copy trained {ONE_BATCH_STEPS} steps on one batch {verb} it (loss {fmt(start)} -> "
        f"{fmt(end)})"
    )


def _shuffled(batches: list[Any]) -> list[Any]:
    """The batches with their labels permuted within each (a fixed seed: the same control)."""
    import torch

    generator = torch.Generator().manual_seed(0)
    shuffled = []
    for inputs, targets in batches:
        order = torch.randperm(targets.shape[0], generator=generator).to(targets.device)
        shuffled.append((inputs, targets[order]))
    return shuffled


def _changed(batches: list[Any], shuffled: list[Any]) -> bool:
    """Whether shuffling changed any label (not when each batch holds one label value)."""
    import torch

    return any(not torch.equal(a[1], b[1]) for a, b in zip(batches, shuffled, strict=True))


AFTER_MEMORIZE = (
    "memorize failed (the training loop cannot overfit one batch), so two copies trained on "
    "true and shuffled labels would tie whatever the labels; fix that first"
)
MORE_STEPS = (
    "a verdict needs copies that learn within the check's steps: a higher learning rate "
    "(lr-range shows where the loss falls fastest) or a model that learns faster; or waive "
    "the check in the configuration"
)


def _unjudged(
    why: str, details: dict[str, Any] | None = None, fix: str = "", measured: str = ""
) -> CheckResult:
    """No verdict, said as a warning: the check ran, and its premise (copies that learn,
    a control that changes the labels the step reads) did not hold."""
    return CheckResult(
        "label-alignment",
        WARN,
        measured or "no verdict: " + why.split(":")[0],
        "copies that learn from the labels they are given",
        cause=f"could not judge: {why}",
        fix=fix or MORE_STEPS,
        details=dict(details or {}, inconclusive=True),
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


@dataclass
class Reading:
    """The two copies scored after ``steps``: held-out, and the true-label copy on its own
    training batches (``fit``: the share of the way from the control's held-out loss down to
    the floor that its own batches cover; ``gain``: the same for its held-out loss)."""

    steps: int
    true: Score
    control: Score
    own: float  # the true-label copy's loss on its own training batches
    floor: float
    gain: float
    fit: float

    def details(self) -> dict[str, Any]:
        return {
            "steps": self.steps,
            "true_loss": self.true.loss,
            "shuffled_loss": self.control.loss,
            "own_batches_loss": self.own,
            "floor": self.floor,
            "gain": self.gain,
            "fit": self.fit,
            "true_accuracy": self.true.accuracy,
            "shuffled_accuracy": self.control.accuracy,
        }

    def text(self) -> str:
        measured = (
            f"held-out loss {fmt(self.true.loss)} with true labels, {fmt(self.control.loss)} "
            f"with shuffled"
        )
        if self.true.accuracy is not None and self.control.accuracy is not None:
            measured += f" (accuracy {self.true.accuracy:.0%} vs {self.control.accuracy:.0%})"
        measured += f"; {fmt(self.own)} on its own training batches, after {self.steps} steps"
        if self.floor < 0:
            measured += (
                f"; the loss goes below zero: floor taken at the lowest seen, {fmt(self.floor)}"
            )
        return measured


def _read(ctx: Context, true: Arm, shuffled: Arm, own: list[Any], val: list[Any]) -> Reading:
    draws = Draws.capture()  # both copies scored on the same draws (a VAE's noise)
    true_score = evaluate(ctx, true.model, val, draws)
    control = evaluate(ctx, shuffled.model, val, draws)
    own_loss = evaluate(ctx, true.model, own, draws).loss
    draws.replay()
    floor = min(0.0, true.lowest, shuffled.lowest, true_score.loss, own_loss)
    span = control.loss - floor

    def share(loss: float) -> float:
        value = (control.loss - loss) / span if span > 0 else 0.0
        return value if math.isfinite(value) else 0.0

    return Reading(
        len(true.losses),
        true_score,
        control,
        own_loss,
        floor,
        share(true_score.loss),
        share(own_loss),
    )


def _labels_unread(ctx: Context, batch: Any, shuffled: Any) -> str:
    """Why there are no labels to judge, or ``""``: a loss_fn that scores the outputs alike
    against the batch's targets and against them shuffled (the shuffled batch evaluated
    too, on the same draws) reads no labels from ``batch[1]`` (a denoiser's loss against
    the noise it drew, a self-supervised loss, an autoencoder's against its inputs)."""
    import torch

    draws = Draws.capture()
    ctx.model.eval()
    try:
        with torch.no_grad():
            # the shuffled labels go through the forward too: an eval_step that gives the
            # model its labels (a Transformers model's own loss) reads them there
            outputs = _jittered(ctx.evaluate(batch, draws=draws))
            moved = _jittered(ctx.evaluate(shuffled, draws=draws))
            given = float(ctx.target.loss_fn(outputs, batch[1]))  # type: ignore[misc]
            other = float(ctx.target.loss_fn(moved, shuffled[1]))  # type: ignore[misc]
    except Exception:  # the checks that run the loss report its errors themselves
        return ""
    finally:
        draws.replay()
    if given != other:
        return ""
    return (
        "no labels to judge: the loss_fn scores the outputs alike against the batch's "
        f"targets and against them shuffled ({fmt(given)}): it reads no labels from batch[1] "
        "(its targets are drawn in the forward, as a denoiser's noise, or are the inputs). "
        "input-dependence judges whether the outputs follow the inputs"
    )


def _jittered(outputs: Any) -> Any:
    """The outputs with their float tensors moved by a little fixed noise: an untrained head
    that scores every example alike (zero-initialised logits) would otherwise score any
    labels alike, as if the loss read none."""
    import torch

    generator = torch.Generator().manual_seed(0)

    def jitter(leaf: Any) -> Any:
        if not (isinstance(leaf, torch.Tensor) and leaf.is_floating_point() and leaf.numel()):
            return leaf
        noise = torch.randn(leaf.shape, generator=generator).to(leaf.device, leaf.dtype)
        return leaf + 0.1 * noise * (1.0 + float(leaf.detach().abs().mean()))

    if isinstance(outputs, torch.Tensor | tuple | list) or type(outputs) is dict:
        return tree_map(jitter, outputs)
    return outputs  # a ModelOutput or another object: read as it is


def _dense(batches: list[Any]) -> tuple[str, Any] | None:
    """(how, the change) that moves dense targets off their inputs' grid: targets with the
    inputs' last two (spatial) dimensions, (N, H, W) class maps or (N, C, H, W) masks, are
    transposed when square, else turned half a turn; None for other targets."""
    import torch

    inputs, targets = batches[0]
    if not isinstance(targets, torch.Tensor) or targets.ndim < 3:
        return None
    grids: list[Any] = []
    tree_map(lambda t: grids.append(t.shape[-2:]) if getattr(t, "ndim", 0) >= 3 else None, inputs)
    height, width = targets.shape[-2:]
    if (height, width) not in grids or min(height, width) < 4:
        return None
    if height == width:
        return "transposed", lambda t: t.transpose(-1, -2)
    return "turned half a turn", lambda t: t.flip(-1, -2)


def _layout_control(
    ctx: Context, true: Arm, batches: list[Any], val: list[Any], warn: float
) -> CheckResult | dict[str, Any] | None:
    """Dense targets (a segmentation mask, a heat map) that do not line up with their image
    still tell a model how much of it is object, so true labels beat shuffled ones. The
    control here is the layout: a copy trained as long on the targets transposed (or turned)
    and scored against held-out targets changed the same way. Aligned targets are learned
    better as they are; targets that line up with their images only once changed (an image
    transposed, its mask not) are learned better changed: a failure, measured."""
    found = _dense(batches)
    if found is None:
        return None
    how, change = found
    moved = [(inputs, change(targets)) for inputs, targets in batches]
    draws = Draws.capture()
    arm = Arm(ctx).train(ctx, list(itertools.islice(itertools.cycle(moved), len(true.losses))))
    draws.replay()
    scored = Draws.capture()
    as_given = evaluate(ctx, true.model, val, scored)
    changed = evaluate(ctx, arm.model, [(i, change(t)) for i, t in val], scored)
    scored.replay()
    floor = min(0.0, as_given.loss, changed.loss, true.lowest, arm.lowest)
    span = max(as_given.loss, changed.loss) - floor
    gain = (changed.loss - as_given.loss) / span if span > 0 else 0.0
    details = {
        "change": how,
        "as_given_loss": as_given.loss,
        "changed_loss": changed.loss,
        "gain": gain,
        "steps": len(true.losses),
    }
    if gain > -warn:
        return details
    return CheckResult(
        "label-alignment",
        FAIL,
        f"held-out loss {fmt(as_given.loss)} with the targets as given, {fmt(changed.loss)} "
        f"with them {how} (each copy trained {len(true.losses)} steps on its own layout): the "
        f"targets {how} line up with the inputs better than as given",
        "targets that line up with their inputs as given (better learned than changed)",
        cause=f"the dense targets do not line up with their inputs: a copy learns them better "
        f"{how} than as given, so the inputs or the targets were {how} (or flipped, resized, "
        "cropped) on one side only",
        fix="apply every spatial transform (transpose, flip, resize, crop, augmentation) to "
        "the image and its target together, and check both come out in the same layout "
        "(channels, height, width)",
        details={"layout": details},
    )


def label_alignment(ctx: Context) -> CheckResult:
    """Shuffled-label control: true labels must beat shuffled labels on held-out data.

    A copy that has not fitted even its own training batches beyond the labels' overall mix
    says nothing of the labels: then both copies train on, up to EXTENDED_STEPS (a count of
    steps: no clock decides it), and a check still without a pass or a measured fault says
    it could not judge (a warning), and why. Both copies train on the same random draws (a
    VAE's noise, dropout masks, augmentations): only the labels differ between them.
    """
    if missing := _needs(ctx, "label-alignment"):
        return missing
    batches = train_batches(ctx, CONTROL_STEPS)
    val = val_batches(ctx)
    if not val:
        return CheckResult("label-alignment", SKIP, cause="the val_loader gave no batches")
    scored = (LEAKAGE_STEPS, val) if len(batches) >= LEAKAGE_STEPS else None
    if ctx.shared.get("memorize") is False:  # an earlier rung: the loop cannot learn at all
        return CheckResult("label-alignment", SKIP, cause=f"could not judge: {AFTER_MEMORIZE}")
    shuffled_batches = _shuffled(batches)
    if not _changed(batches, shuffled_batches):
        return _unjudged(
            "every training batch holds one label value, so shuffling labels within a batch "
            "changes nothing: the training data is not shuffled (see shuffle)",
            fix="shuffle the training data (DataLoader(shuffle=True))",
        )
    unread = _labels_unread(ctx, batches[0], shuffled_batches[0])
    if unread:
        return CheckResult("label-alignment", SKIP, cause=unread)
    draws = Draws.capture()  # both copies draw the same dropout masks and augmentations
    true = Arm(ctx).train(ctx, batches, scored)
    moved = _moved(ctx.model, true.model)
    if moved < NEVER_TRAINED:  # the premise failed: copies that never trained say nothing
        return _unjudged(
            f"the copy trained on the true labels for {len(batches)} steps did not change (its "
            f"weights moved by {moved:.1e} of their norm): the optimizer updates nothing",
            {"weights_moved": moved, "steps": len(batches)},
            fix="check the optimizer factory uses the parameters it is given "
            "(optimizer-coverage), and the learning rate (lr-range)",
        )
    draws.replay()
    shuffled = Arm(ctx).train(ctx, shuffled_batches)
    if true.losses == shuffled.losses:
        return _unjudged(
            "the training step gave the same loss at every step with shuffled labels as with "
            "the true ones: it does not read its labels from the batch's targets (the second "
            "item of (inputs, targets)), so this control cannot change them",
            {"steps": len(batches)},
            fix="make the step read its labels from batch[1] (see docs/target.md), or waive "
            "the check",
        )
    own = batches[:EVAL_BATCHES]
    reading = _read(ctx, true, shuffled, own, val)
    warn = ctx.policy.threshold("label-alignment", "warn-gain")
    fail = ctx.policy.threshold("label-alignment", "fail-gain")
    if reading.gain < warn and len(batches) < EXTENDED_STEPS:  # no pass yet: train on
        extra = EXTENDED_STEPS - len(batches)
        draws = Draws.capture()
        true.train(ctx, list(itertools.islice(itertools.cycle(batches), extra)))
        draws.replay()
        shuffled.train(ctx, list(itertools.islice(itertools.cycle(shuffled_batches), extra)))
        reading = _read(ctx, true, shuffled, own, val)
    details = reading.details()
    expected = f"true labels clearly better (loss at least {warn:.0%} of the way lower)"
    layout = _layout_control(ctx, true, batches, val, warn)
    if isinstance(layout, CheckResult):  # the shuffled-label reading beside it, for the record
        layout.details["shuffled_labels"] = details
        return layout
    if layout:
        details["layout"] = layout
    if reading.gain >= warn:
        return CheckResult("label-alignment", PASS, reading.text(), expected, details=details)
    cause = (
        "the copy trained on the true labels fits its own training batches but "
        "generalises no better than one trained on shuffled labels: the labels do not belong "
        "to their inputs"
    )
    if reading.fit < FIT_PREMISE:  # it learned nothing from its own batches: can it learn?
        learns, how = _learns(ctx, batches[0])
        details["loop_learns"] = how
        if not learns:
            return _unjudged(
                f"after {reading.steps} steps the copy trained on the true labels fits its own "
                f"training batches (loss {fmt(reading.own)}) no better than the shuffled-label "
                f"copy fits held-out data ({fmt(reading.control.loss)}), and {how}: the loop "
                "learns nothing at this rate in these steps, and two copies that learned "
                "nothing tie whatever the labels are",
                details,
                measured=reading.text(),
            )
        cause = (
            f"the loop learns ({how}), yet after {reading.steps} steps neither copy has learned "
            "anything from its labels beyond their overall mix: the labels do not belong to "
            "their inputs (or the task needs far more steps than this check takes)"
        )
    return CheckResult(
        "label-alignment",
        FAIL if reading.gain < fail else WARN,
        reading.text(),
        expected,
        details=details,
        cause=cause,
        fix="check that inputs and labels are indexed together (a sort, a shuffle or a join that "
        "touched only one of them)",
    )
