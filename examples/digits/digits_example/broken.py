"""Deliberately broken variants of the example: each trains without crashing, and learns nothing.

dl-ci's memorization test must fail each of them with a message that points at the bug.
"""

from __future__ import annotations

import torch

import dlci
from digits_example.model import SmallCNN
from digits_example.target import make_target


class DetachedCNN(SmallCNN):
    """The bug: the output is cut from the graph (as ``.detach()`` or ``.data`` in forward do)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x).detach()


def make_detached_target() -> dlci.Target:
    """The output is detached: no gradient reaches any weight."""
    target = make_target()
    target.model = DetachedCNN()
    return target


def make_tiny_lr_target() -> dlci.Target:
    """A learning rate seven orders of magnitude too small: the loss barely moves."""
    return make_target(lr=1e-9)
