"""What a LightningModule's ``configure_optimizers`` returns, read the way Lightning reads it:
one optimizer and its schedulers, or one DlciError that says what dl-ci does not run."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dlci.errors import DlciError

MULTIPLE_HINT = (
    "dl-ci trains with one optimizer; return one from configure_optimizers, or write the "
    "loop as dlci.Target(model, optimizer, train_loader, train_step=...) with your own step "
    "(a GAN's two optimizers, for example)"
)


@dataclass(frozen=True)
class Scheduler:
    """One scheduler and when Lightning steps it. ``self.lr_schedulers()`` reads ``scheduler``."""

    scheduler: Any
    interval: str = "epoch"
    frequency: int = 1

    def steps_after(self, optimizer_steps: int) -> bool:
        """Whether Lightning steps this scheduler after optimizer step ``optimizer_steps``.

        Interval ``step``: every ``frequency`` steps. Interval ``epoch``: at the end of an
        epoch of the training data, which dl-ci's runs (one batch, a few hundred steps) never
        reach, so not stepped. ReduceLROnPlateau steps on a monitored metric that dl-ci does
        not compute: not stepped.
        """
        from torch.optim.lr_scheduler import ReduceLROnPlateau

        if self.interval != "step" or isinstance(self.scheduler, ReduceLROnPlateau):
            return False
        return optimizer_steps % self.frequency == 0


def parse_configure_optimizers(configured: Any) -> tuple[Any, list[Scheduler]]:
    """The optimizer and schedulers of every form Lightning documents for one optimizer: an
    optimizer; a dict with ``optimizer`` and ``lr_scheduler``; ``([optimizer], [schedulers])``;
    a one-item list or tuple of any of these."""
    import torch

    if isinstance(configured, torch.optim.Optimizer):
        return configured, []
    if isinstance(configured, dict):
        return _from_dict(configured)
    if isinstance(configured, list | tuple):
        items = list(configured)
        if len(items) == 2 and all(isinstance(i, list | tuple) for i in items):
            optimizers, schedulers = items
            if len(optimizers) == 1:
                return _optimizer(optimizers[0]), [_scheduler(s) for s in schedulers]
            items = list(optimizers)
        if len(items) == 1:
            return parse_configure_optimizers(items[0])
        if len(items) > 1:
            raise DlciError(
                f"configure_optimizers returned {len(items)} optimizers", hint=MULTIPLE_HINT
            )
    if configured is None:
        raise DlciError(
            "configure_optimizers returned None, so Lightning would train without an optimizer",
            hint="return the optimizer (and its scheduler) from configure_optimizers",
        )
    raise DlciError(
        f"configure_optimizers returned a {type(configured).__name__}, which is not one of "
        "Lightning's forms",
        hint="return an optimizer, a dict {'optimizer': ..., 'lr_scheduler': ...}, or "
        "([optimizer], [scheduler])",
    )


def _optimizer(value: Any) -> Any:
    import torch

    if isinstance(value, torch.optim.Optimizer):
        return value
    if isinstance(value, dict):
        raise DlciError(
            "configure_optimizers mixed dicts into ([optimizers], [schedulers])",
            hint="return a dict {'optimizer': ..., 'lr_scheduler': ...} on its own",
        )
    raise DlciError(
        f"configure_optimizers returned a {type(value).__name__} where an optimizer belongs",
        hint="return a torch.optim.Optimizer",
    )


def _from_dict(configured: dict[str, Any]) -> tuple[Any, list[Scheduler]]:
    unknown = sorted(set(configured) - {"optimizer", "lr_scheduler", "monitor"})  # Lightning's
    if unknown:
        raise DlciError(
            f"configure_optimizers returned a dict with unknown keys {unknown}",
            hint="Lightning reads the keys optimizer, lr_scheduler and monitor",
        )
    if "optimizer" not in configured:
        raise DlciError(
            "configure_optimizers returned a dict without 'optimizer'",
            hint="return {'optimizer': optimizer, 'lr_scheduler': scheduler}",
        )
    optimizer = _optimizer(configured["optimizer"])
    given = configured.get("lr_scheduler")
    schedulers = [] if given is None else [_scheduler(given)]
    return optimizer, schedulers


def _scheduler(given: Any) -> Scheduler:
    """A scheduler, or Lightning's scheduler dict (scheduler, interval, frequency, ...)."""
    if not isinstance(given, dict):
        return Scheduler(given)
    if "scheduler" not in given:
        raise DlciError(
            "configure_optimizers: an lr_scheduler dict without 'scheduler'",
            hint="give {'scheduler': scheduler, 'interval': 'step'}",
        )
    interval = given.get("interval", "epoch")
    frequency = given.get("frequency", 1)
    if interval not in ("step", "epoch"):
        raise DlciError(
            f"configure_optimizers: lr_scheduler interval {interval!r}",
            hint="Lightning's intervals are 'step' and 'epoch'",
        )
    if isinstance(frequency, bool) or not isinstance(frequency, int) or frequency < 1:
        raise DlciError(
            f"configure_optimizers: lr_scheduler frequency {frequency!r}",
            hint="a frequency is a whole number of intervals, 1 or more",
        )
    return Scheduler(given["scheduler"], interval, frequency)
