"""input-dependence: a trained model's outputs must depend on its inputs.

A loop can train, and its loss fall, while the outputs ignore the inputs: a VAE whose
reconstruction term is averaged while its KL term is summed collapses to the mean image
(posterior collapse), a refactor feeds the network zeros, an input path is cut. memorize
then sees a loss that fell; nothing else asks whether the outputs come from the inputs.

A copy trains STEPS steps on the doctor's batch; then, in eval mode and on the same random
draws, its inputs are swapped between examples (each example takes the next one's inputs)
and its outputs compared with those on the batch as it is. Where the outputs depend on the
inputs, the swap moves them about as far as it moves the targets (a model that fits its
targets follows them); where they do not, the outputs stay where they were. The move is
measured in the targets' units: class probabilities against one-hot labels, values against
float targets (``batch[1]``), or against the inputs themselves where those are what the
outputs reproduce (an autoencoder, a VAE, a denoiser: the targets are the inputs).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from dlci.checks.base import FAIL, PASS, SKIP, WARN, CheckResult, Context, fmt
from dlci.training.batching import batch_size_of, logits_of, tree_map
from dlci.training.copying import model_copy
from dlci.training.draws import Draws, differs

STEPS = 50  # training steps of the copy on the doctor's batch
FAIL_RATIO = 0.02  # the outputs move under this share of the targets' move: no dependence
SHRANK = 4  # ... and under a quarter of what they moved untrained
FELL = 0.75  # ... while the loss fell under this share of its start (a positive loss)
NOISE = 0.25  # same input, same draws: a difference above this share of the move, no verdict


def _rms(a: Any, b: Any) -> float:
    return float((a.detach().double() - b.detach().double()).pow(2).mean().sqrt())


def _swapped(inputs: Any, size: int) -> Any:
    """The inputs with each example's tensors taken from the next example (a roll by one)."""
    import torch

    def roll(leaf: Any) -> Any:
        if isinstance(leaf, torch.Tensor) and leaf.ndim >= 1 and leaf.shape[0] == size:
            return leaf.roll(1, dims=0)
        return leaf

    return tree_map(roll, inputs)


def _leaves(value: Any) -> list[Any]:
    import torch

    found: list[Any] = []
    tree_map(lambda leaf: found.append(leaf) if isinstance(leaf, torch.Tensor) else None, value)
    return found


def _in_target_units(
    ctx: Context, outputs: Any, batch: Any, size: int
) -> tuple[Any, Any, str] | str:
    """(a function from outputs to values in the targets' units, the targets, what they
    are), or why the outputs cannot be compared with any targets."""
    import torch

    inputs, targets = batch
    if not (isinstance(outputs, torch.Tensor) and outputs.ndim >= 1 and outputs.shape[0] == size):
        return (
            "the outputs hold no tensor with one row per example (scores flattened to one "
            "row per token, or time-major, are not read by this check)"
        )
    per = outputs[0].numel()
    classes = ctx.classes()[0]
    labels = isinstance(targets, torch.Tensor) and not targets.is_floating_point()
    if labels and not classes and targets.ndim >= 2 and outputs.shape[:-1] == targets.shape:
        classes = int(outputs.shape[-1])  # per-position scores (N, L, V) of (N, L) labels
    if labels and classes and outputs.ndim == targets.ndim + 1 and int(targets.max()) < classes:
        # class labels: (N, C) scores, or dense (N, C, H, W) / (N, L, C) against (N, H, W) /
        # (N, L); a negative label is an ignore index, left out on both sides
        axis = 1 if outputs.shape[1] == classes and outputs.shape[2:] == targets.shape[1:] else -1
        if outputs.shape[axis] == classes:
            kept = (targets >= 0).unsqueeze(axis).float()
            hot = torch.nn.functional.one_hot(targets.long().clamp(min=0), classes).float()
            hot = (hot.movedim(-1, 1) if axis == 1 else hot) * kept
            return (
                (lambda o: o.float().softmax(dim=axis) * kept),
                hot,
                "the class labels (one-hot)",
            )
    if (
        isinstance(targets, torch.Tensor)
        and targets.is_floating_point()
        and targets.ndim >= 1
        and targets.shape[0] == size
        and targets[0].numel() == per
    ):
        return (lambda o: o.float().reshape(targets.shape)), targets.float(), "the targets"
    for leaf in _leaves(inputs):
        if leaf.is_floating_point() and leaf.ndim >= 1 and leaf.shape[0] == size:
            if leaf[0].numel() != per:
                continue
            return (
                (lambda o, shape=leaf.shape: o.float().reshape(shape)),
                leaf.float(),
                "the inputs (the outputs reproduce them: an autoencoder's targets)",
            )
    return (
        f"the outputs {tuple(outputs.shape)} are neither class scores of the targets (give "
        "num_classes), nor one value per target value, nor one value per input value"
    )


@dataclass
class Reading:
    """One model's outputs on the batch, on the batch again and on the swapped inputs, in
    the targets' units, with how far the swap and the repeat moved them."""

    output_move: float
    noise: float
    target_move: float
    what: str
    anything_moved: bool = True  # any tensor of the outputs, not only the scores read

    @property
    def ratio(self) -> float:
        return self.output_move / self.target_move


def _read(ctx: Context, model: Any, size: int) -> Reading | str:
    import torch

    model.eval()
    draws = Draws.capture()
    swapped = (_swapped(ctx.batch[0], size), ctx.batch[1])
    with torch.no_grad():
        raw = ctx.evaluate(model=model, draws=draws)
        outputs = logits_of(raw, size)
        again = logits_of(ctx.evaluate(model=model, draws=draws), size)
        moved_raw = ctx.evaluate(swapped, model=model, draws=draws)
        moved = logits_of(moved_raw, size)
    draws.replay()
    units = _in_target_units(ctx, outputs, ctx.batch, size)
    if isinstance(units, str):
        return units
    convert, targets, what = units
    if not all(isinstance(t, torch.Tensor) and t.shape == outputs.shape for t in (again, moved)):
        return "the outputs on the swapped inputs are not of the same shape as on the batch"
    out = convert(outputs)
    gap = differs(raw, moved_raw)  # None: not comparable, so say something moved
    return Reading(
        _rms(convert(moved), out),
        _rms(convert(again), out),
        _rms(targets.roll(1, dims=0), targets),
        what,
        gap is None or gap > 0,
    )


def input_dependence(ctx: Context) -> CheckResult:
    if ctx.shared.get("memorize") is False:
        return CheckResult(
            "input-dependence",
            SKIP,
            cause="could not judge: memorize failed (the loop cannot fit one batch), so a "
            "copy trained here would say nothing of what its outputs follow; fix that first",
        )
    size = batch_size_of(ctx.batch)
    if size < 2:
        return CheckResult("input-dependence", SKIP, cause="the batch has fewer than 2 examples")
    if not any(leaf.ndim >= 1 and leaf.shape[0] == size for leaf in _leaves(ctx.batch[0])):
        return CheckResult(
            "input-dependence",
            SKIP,
            cause=f"no tensor of the inputs has a row per example ({size}) to swap, in tuples, "
            "lists or dicts (a dataclass or another object is not looked inside)",
        )
    model = model_copy(ctx.model)
    before = _read(ctx, model, size)
    if isinstance(before, str):
        return CheckResult("input-dependence", SKIP, cause=before)
    if before.target_move == 0 or not math.isfinite(before.target_move):
        return CheckResult(
            "input-dependence",
            SKIP,
            cause=f"the batch's examples share one target ({before.what}): no swap moves them",
        )
    model.train()
    optimizer = ctx.optimizer(model)
    losses = [ctx.step(model, optimizer) for _ in range(STEPS)]
    after = _read(ctx, model, size)
    assert not isinstance(after, str)  # the same outputs' structure as before training
    start, end = losses[0], min(losses[-5:])
    ratio, first = after.ratio, before.ratio
    details: dict[str, Any] = {
        "steps": STEPS,
        "targets": after.what,
        "output_move": after.output_move,
        "target_move": after.target_move,
        "noise": after.noise,
        "ratio": ratio,
        "ratio_untrained": first,
        "loss_start": start,
        "loss_end": end,
    }
    measured = (
        f"swapping the inputs between examples moved the outputs by {ratio:.1%} of how far it "
        f"moves {after.what}, after {STEPS} steps on the batch (loss {fmt(start)} -> "
        f"{fmt(end)}); {first:.1%} untrained"
    )
    expected = (
        f"outputs that follow their inputs: none at all, or under {FAIL_RATIO:.0%} of the "
        "targets' move after training made them follow the inputs less, fails"
    )
    noise = max(after.noise, before.noise)
    if not math.isfinite(noise) or (noise > 0 and noise > NOISE * after.output_move):
        return CheckResult(
            "input-dependence",
            WARN,
            f"the same batch gave outputs {fmt(noise)} apart on two calls with the same random "
            f"draws, against a move of {fmt(after.output_move)} when the inputs were swapped",
            expected,
            cause="could not judge: the outputs change from call to call for the same inputs "
            "and draws (a generator of the model's own, state carried across calls), so a "
            "move under the swap is no measure of what the outputs follow",
            fix="draw from torch's global generator and reset state carried across calls",
            details=dict(details, inconclusive=True),
        )
    fell = math.isfinite(start) and math.isfinite(end) and end < FELL * start
    blind = not (before.anything_moved or after.anything_moved)
    if blind and after.output_move == 0 and before.output_move == 0:
        cause = (
            "the outputs do not depend on the inputs at all, trained or not: the inputs are "
            "replaced or zeroed on their way through the forward, or the path from them is cut "
            "(a detach, a constant in their place)"
        )
    elif ratio < FAIL_RATIO and ratio < first / SHRANK and fell:
        cause = (
            f"training made the outputs follow the inputs less ({first:.1%} untrained, "
            f"{ratio:.1%} after {STEPS} steps) while the loss fell: the model learned outputs "
            "that fit every example alike (the mean target). Posterior collapse (a VAE whose "
            "KL term outweighs its reconstruction term: a summed KL against an averaged "
            "reconstruction), or an input path that training shuts (a gate, a skip around it)"
        )
    else:
        return CheckResult("input-dependence", PASS, measured, expected, details=details)
    return CheckResult(
        "input-dependence",
        FAIL,
        measured,
        expected,
        cause=cause,
        fix="check the forward reads the inputs it is given (print the first layer's input); "
        "for a VAE, reduce the reconstruction and the KL term the same way (both summed, as "
        "in the paper, or both averaged per example)",
        details=details,
    )
