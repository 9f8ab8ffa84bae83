"""``num_classes`` of a LightningModule, where the module or its data states it."""

from __future__ import annotations

from typing import Any, TypeGuard

from dlci.training.adapters import PairLoader
from dlci.training.lightning_state import is_metric


def module_num_classes(module: Any, datamodule: Any, train: PairLoader | None = None) -> int | None:
    """``num_classes`` where the module or its data states it: the module's hyperparameters
    or attribute, the datamodule's attribute, the torchmetrics metrics it holds (when they
    agree), else its head's ``out_features`` when the targets are class indices below it."""
    hparams = getattr(module, "hparams", None) or {}
    for value in (
        hparams.get("num_classes") if hasattr(hparams, "get") else None,
        getattr(module, "num_classes", None),
        getattr(datamodule, "num_classes", None),
    ):
        if _is_classes(value):
            return int(value)
    stated = {getattr(m, "num_classes", None) for m in module.modules() if is_metric(m)} - {None}
    if len(stated) == 1 and _is_classes(value := next(iter(stated))):
        return int(value)
    return _head_classes(module, train)


def _is_classes(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 2


def _head_classes(module: Any, train: PairLoader | None) -> int | None:
    """The last layer's ``out_features`` when it is a Linear layer, it is the module's last
    layer with parameters, and the first batch's targets are integer class indices below it
    (a regression head of the same width is not taken for a classifier)."""
    import torch
    from torch import nn
    from torch.utils.data import DataLoader

    leaves = [m for m in module.modules() if not list(m.children()) and list(m.parameters())]
    leaves = [m for m in leaves if not is_metric(m)]
    if not leaves or not isinstance(leaves[-1], nn.Linear) or train is None:
        return None
    classes = leaves[-1].out_features
    # a DataLoader can be iterated again; another iterable might be used up by the peek
    if not _is_classes(classes) or not isinstance(train.loader, DataLoader):
        return None
    try:
        with torch.random.fork_rng(devices=[]):  # the peek draws no random numbers of the run
            _, targets = next(iter(train))
    except Exception:  # no batch to judge from: nothing is taken
        return None
    if (
        isinstance(targets, torch.Tensor)
        and targets.ndim == 1
        and not targets.is_floating_point()
        and targets.dtype != torch.bool
        and targets.numel() > 0
        and int(targets.min()) >= 0
        and int(targets.max()) < classes
    ):
        return int(classes)
    return None
