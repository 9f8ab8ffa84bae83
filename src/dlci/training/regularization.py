"""Every regularisation off for the memorization test, and a check that it is.

Dropout hides in more places than ``nn.Dropout`` modules: the float ``dropout`` of
``nn.MultiheadAttention`` and ``nn.Transformer*`` layers, the attention dropout of
Transformers' models (a float read from the module or its ``config`` at each forward:
``attention_dropout``, ``attention_probs_dropout_prob``), timm's stochastic depth
(``drop_prob``) and functional dropout driven by ``self.training`` (``F.dropout(x, 0.1,
self.training)``, ``scaled_dot_product_attention(..., dropout_p=0.1)``). The first kinds are
set to 0 where they are stored; the functional kind is caught where it is called, by a torch
function mode that runs every dropout call with p = 0 while the gate trains. Then
``still_random`` runs two train-mode forward passes on fresh draws: if they differ, what
differs is named, instead of a "dropout off" that did not hold.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

# attributes that hold a dropout probability read at forward time (modules and configs)
_DROPOUT_NAMES = (
    "dropout",
    "dropout_p",
    "dropout_prob",
    "dropout_rate",
    "attention_dropout",
    "attn_dropout",
    "attn_drop",
    "attn_pdrop",
    "resid_pdrop",
    "embd_pdrop",
    "hidden_dropout",
    "hidden_dropout_prob",
    "attention_probs_dropout_prob",
    "classifier_dropout",
    "activation_dropout",
    "drop_prob",
    "drop_path",
    "drop_path_rate",
    "drop_rate",
    "p_drop",
    "layerdrop",
)


@dataclass
class Switched:
    """What ``switch_off_regularization`` changed: one line each, and the values to put back."""

    changes: list[str] = field(default_factory=list)
    saved: list[tuple[Any, str, float]] = field(default_factory=list)

    def restore(self) -> None:
        """Put the model's dropout rates back (the gate's optimizer is its own)."""
        for holder, attr, value in reversed(self.saved):
            try:
                setattr(holder, attr, value)
            except Exception:  # noqa: S112  # pragma: no cover - it was set once already
                continue


def switch_off_regularization(model: Any, optimizer: Any) -> Switched:
    """Dropout of every kind and weight decay to 0, with one line per change made."""
    from torch.nn.modules.dropout import _DropoutNd

    switched = Switched()
    seen_configs: set[int] = set()
    for name, module in model.named_modules():
        where = name or "model"
        if isinstance(module, _DropoutNd):
            if module.p > 0:
                switched.changes.append(
                    f"dropout off: {where} ({type(module).__name__}, p={module.p:g} -> 0)"
                )
                switched.saved.append((module, "p", module.p))
                module.p = 0.0
            continue
        _zero_floats(module, f"{where} ({type(module).__name__})", switched)
        if "drop" in type(module).__name__.lower():  # a DropPath of its own keeps its rate in p
            _zero_floats(module, f"{where} ({type(module).__name__})", switched, ("p",))
        config = getattr(module, "config", None)
        if config is not None and id(config) not in seen_configs and not _is_module(config):
            seen_configs.add(id(config))
            _zero_floats(config, f"{where}.config", switched)
    for index, group in enumerate(optimizer.param_groups):
        decay = group.get("weight_decay", 0) or 0
        if decay > 0:
            switched.changes.append(f"weight decay off: param group {index} ({decay:g} -> 0)")
            group["weight_decay"] = 0.0
    return switched


def _is_module(value: Any) -> bool:
    import torch

    return isinstance(value, torch.nn.Module)


def _zero_floats(
    holder: Any, where: str, switched: Switched, names: tuple[str, ...] = _DROPOUT_NAMES
) -> None:
    """Set the dropout probabilities ``holder`` keeps as plain floats to 0."""
    for attr in names:
        try:
            value = getattr(holder, attr, None)
        except Exception:  # noqa: S112  # a property that raises is not a probability
            continue
        if isinstance(value, bool) or not isinstance(value, float) or not 0 < value < 1:
            continue
        try:
            setattr(holder, attr, 0.0)
        except Exception:  # noqa: S112  # a read-only attribute: the function mode still catches its use
            continue
        switched.changes.append(f"dropout off: {where}.{attr} ({value:g} -> 0)")
        switched.saved.append((holder, attr, value))


@contextmanager
def no_dropout() -> Iterator[list[str]]:
    """Every functional dropout call in the block runs with p = 0; the list names the
    functions it caught (once each)."""
    import torch
    from torch.overrides import TorchFunctionMode

    functional = torch.nn.functional
    dropouts = {
        functional.dropout,
        functional.dropout1d,
        functional.dropout2d,
        functional.dropout3d,
        functional.alpha_dropout,
        functional.feature_alpha_dropout,
        torch.dropout,
        torch.alpha_dropout,
        torch.feature_dropout,
        torch.feature_alpha_dropout,
    }
    attention = functional.scaled_dot_product_attention
    caught: list[str] = []

    class _NoDropout(TorchFunctionMode):
        def __torch_function__(
            self, func: Any, types: Any, args: Any = (), kwargs: Any = None
        ) -> Any:
            kwargs = dict(kwargs or {})
            if func in dropouts:
                args, kwargs = _zeroed(args, kwargs, "p", 1, caught, func)
            elif func is attention:
                args, kwargs = _zeroed(args, kwargs, "dropout_p", 4, caught, func)
            return func(*args, **kwargs)

    with _NoDropout():
        yield caught


def _zeroed(
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    key: str,
    index: int,
    caught: list[str],
    func: Any,
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    value = kwargs.get(key, args[index] if len(args) > index else 0.0)
    if isinstance(value, int | float) and value > 0:
        name = f"{getattr(func, '__module__', '') or 'torch'}.{getattr(func, '__name__', func)}"
        if name not in caught:
            caught.append(name)
        if key in kwargs or len(args) <= index:
            kwargs[key] = 0.0
        else:
            args = (*args[:index], 0.0, *args[index + 1 :])
    return args, kwargs
