"""Functional dropout at p = 0 for the rest of a script, by its functions, not a mode.

The gate for a Target runs each step under a ``TorchFunctionMode`` (training/regularization.py
``no_dropout``) that sees every torch call of the step; over a whole script that mode costs
every op a Python call (a 2-layer transformer's step took 1.49x as long, measured paired on
the same batch). Script mode replaces the dropout functions themselves, where code reaches
them (``torch.nn.functional.dropout`` and its kin, ``torch.dropout`` and its kin, the
``dropout_p`` of ``torch.nn.functional.scaled_dot_product_attention``): the hooks are
installed before the script imports anything, so its modules, and the libraries it imports,
find the replacements; ``nn.Dropout`` modules call ``F.dropout`` through the module, and are
switched to p = 0 as well. Only these calls pay.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

# (module path, function, index of the rate among the positional arguments, its keyword)
FUNCTIONS = (
    ("torch.nn.functional", "dropout", 1, "p"),
    ("torch.nn.functional", "dropout1d", 1, "p"),
    ("torch.nn.functional", "dropout2d", 1, "p"),
    ("torch.nn.functional", "dropout3d", 1, "p"),
    ("torch.nn.functional", "alpha_dropout", 1, "p"),
    ("torch.nn.functional", "feature_alpha_dropout", 1, "p"),
    ("torch", "dropout", 1, "p"),
    ("torch", "alpha_dropout", 1, "p"),
    ("torch", "feature_dropout", 1, "p"),
    ("torch", "feature_alpha_dropout", 1, "p"),
    ("torch.nn.functional", "scaled_dot_product_attention", 4, "dropout_p"),
)


@contextmanager
def functional_dropout_off() -> Iterator[list[str]]:
    """Every call of a dropout function in the block runs with a rate of 0; the list names
    the functions called with a rate above 0 (once each)."""
    caught: list[str] = []
    undo: list[Callable[[], None]] = []
    for module_name, name, index, key in FUNCTIONS:
        module = importlib.import_module(module_name)
        original = getattr(module, name, None)
        if original is None:  # pragma: no cover - an older torch
            continue
        label = f"{module_name}.{name}"
        setattr(module, name, _zeroing(original, index, key, label, caught))
        undo.append(functools.partial(setattr, module, name, original))
    try:
        yield caught
    finally:
        for step in reversed(undo):
            step()


def _zeroing(original: Any, index: int, key: str, label: str, caught: list[str]) -> Any:
    @functools.wraps(original)
    def call(*args: Any, **kwargs: Any) -> Any:
        if key in kwargs:
            if _positive(kwargs[key]):
                kwargs[key] = 0.0
                _note(caught, label)
        elif len(args) > index and _positive(args[index]):
            args = (*args[:index], 0.0, *args[index + 1 :])
            _note(caught, label)
        return original(*args, **kwargs)

    return call


def _positive(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value > 0


def _note(caught: list[str], label: str) -> None:
    if label not in caught:
        caught.append(label)
