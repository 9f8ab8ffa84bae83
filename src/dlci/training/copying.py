"""A copy of the user's model that a check can train on its own.

``copy.deepcopy`` refuses a tensor that is not a graph leaf, and real modules keep some
between steps: a torchmetrics metric's last value (``self.train_loss(loss)`` caches the loss
with its graph), an RNN's hidden state kept on the module (``self.hidden``), a cached
activation. A Trainer never copies the module, so this code trains fine; the copy here takes
such tensors detached (values kept, graph dropped: a copy starts from no graph anyway).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

MAX_DEPTH = 3  # containers inside a module's attributes searched for tensors


def model_copy(model: Any) -> Any:
    """``copy.deepcopy(model)``, with every non-leaf tensor in a submodule's attributes
    (directly or inside tuples, lists and dicts) copied detached.

    >>> import torch
    >>> layer = torch.nn.Linear(2, 1)
    >>> layer.last = layer(torch.ones(1, 2))  # a cached output with its graph
    >>> twin = model_copy(layer)
    >>> twin.last.grad_fn is None, bool(twin.last == layer.last)
    (True, True)
    """
    memo: dict[int, Any] = {}
    for tensor in _graph_tensors(model):
        memo[id(tensor)] = tensor.detach().clone()
    return copy.deepcopy(model, memo)


def _graph_tensors(model: Any) -> Iterator[Any]:
    import torch

    def walk(value: Any, depth: int) -> Iterator[Any]:
        if isinstance(value, torch.Tensor):
            if value.grad_fn is not None:
                yield value
        elif depth < MAX_DEPTH and isinstance(value, list | tuple | set):
            for item in value:
                yield from walk(item, depth + 1)
        elif depth < MAX_DEPTH and isinstance(value, dict):
            for item in value.values():
                yield from walk(item, depth + 1)

    for module in model.modules():
        for name, value in vars(module).items():
            if name not in ("_parameters", "_buffers", "_modules"):
                yield from walk(value, 0)
