"""Sabotaged variants of the user's own target: what the proposed tiers can still catch.

Each variant is a bug a memorization test is meant to see, applied to the target the user's
factory returned (the same model, optimizer factory, batch and step), so the power table is
about this model, not a toy:

- ``lr_x10`` and ``lr_div100``: every parameter group's learning rate times 10, or over 100;
- ``frozen``: every learning rate 0, a model that cannot learn at all: the control every
  proposed row must catch (an absolute threshold of 1.0 passed a frozen binary classifier);
- ``frozen_layer``: the layer with the most parameters no longer trains (a forgotten
  ``requires_grad``, or a layer left out of the optimizer);
- ``shuffled_labels``: the batch's labels permuted anew at every step, so labels no longer
  belong to their inputs. (A permutation fixed once is memorized like any other labels: the
  memorization test cannot see that bug; ``dlci doctor``'s label checks can.)

A variant that cannot apply (an optimizer without a learning rate, a model of one layer, a
batch of one example) is reported as not applicable rather than guessed at.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from dlci.training.batching import tree_map
from dlci.training.target import Target

HEALTHY = "healthy"
VARIANTS: dict[str, str] = {
    "lr_x10": "learning rate x10",
    "lr_div100": "learning rate /100",
    "frozen": "every learning rate 0: the model never updates",
    "frozen_layer": "the largest layer frozen",
    "shuffled_labels": "labels shuffled within the batch at every step",
}


class NotApplicable(Exception):
    """The variant makes no sense for this target; the message says why."""


def sabotage(target: Target, variant: str, seed: int) -> str:
    """Apply ``variant`` to ``target`` in place; what was changed, in words."""
    if variant in ("lr_x10", "lr_div100", "frozen"):
        factor = {"lr_x10": 10.0, "lr_div100": 0.01, "frozen": 0.0}[variant]
        return _scale_lr(target, factor)
    if variant == "frozen_layer":
        return _freeze_largest(target)
    if variant == "shuffled_labels":
        return _shuffle_labels(target, seed)
    raise ValueError(f"unknown variant {variant!r}")


def _scale_lr(target: Target, factor: float) -> str:
    build = target.optimizer

    def scaled(params: Iterable[Any]) -> Any:
        optimizer = build(params)
        for group in optimizer.param_groups:
            if "lr" not in group:
                raise NotApplicable(f"{type(optimizer).__name__} has no learning rate")
            group["lr"] = group["lr"] * factor
        return optimizer

    target.optimizer = scaled
    return f"every parameter group's lr x{factor:g}"


def _freeze_largest(target: Target) -> str:
    layers = [
        (sum(p.numel() for p in params), name or "model", params)
        for name, module in target.model.named_modules()
        if (params := [p for p in module.parameters(recurse=False) if p.requires_grad])
    ]
    if len(layers) < 2:
        raise NotApplicable("the model has fewer than two layers with trainable parameters")
    size, name, params = max(layers, key=lambda layer: layer[0])
    for param in params:
        param.requires_grad_(False)
    return f"{name} frozen ({size} of {sum(layer[0] for layer in layers)} parameters)"


def _shuffle_labels(target: Target, seed: int) -> str:
    import torch

    generator = torch.Generator().manual_seed(seed)

    def permuted(labels: Any) -> Any:
        leaves: list[Any] = []
        tree_map(leaves.append, labels)
        first: Any = leaves[0] if leaves else None
        count = int(first.shape[0]) if first is not None and first.ndim > 0 else 0
        if count < 2:
            raise NotApplicable("the batch has fewer than two examples")
        order = torch.randperm(count, generator=generator)
        return tree_map(lambda leaf: leaf[order.to(leaf.device)], labels)

    if target.train_step is not None:
        step: Callable[[Any, Any, Any], Any] = target.train_step

        def shuffled_step(model: Any, batch: Any, optimizer: Any) -> Any:
            inputs, labels = batch
            return step(model, (inputs, permuted(labels)), optimizer)

        target.train_step = shuffled_step
        return "the labels given to train_step permuted at every step"
    loss_fn = target.loss_fn
    assert loss_fn is not None  # a Target has a loss_fn or a train_step

    def shuffled_loss(outputs: Any, labels: Any) -> Any:
        return loss_fn(outputs, permuted(labels))

    target.loss_fn = shuffled_loss
    return "the labels given to loss_fn permuted at every step"
