"""What a ``training_step`` may read or log besides its batch, answered as a Trainer would.

A LightningModule run by a Fabric sees ``self.trainer`` as a shim over the Fabric, takes only
numbers and tensors in ``self.log`` and has ``global_step`` 0. Real modules log torchmetrics
objects and read the step, the epoch, the logged metrics and ``self.logger.experiment``, so
for the duration of a step dl-ci gives the module:

- ``self.log`` / ``self.log_dict`` that take what a Trainer takes (numbers, one-element
  tensors, torchmetrics ``Metric`` and ``MetricCollection`` objects) and refuse what it refuses
  with Lightning's own messages; the values are kept as the Trainer's ``logged_metrics``,
  ``callback_metrics`` and ``progress_bar_metrics`` (a metric's value is that of its last
  ``forward``, which is what a Trainer logs on the step); nothing is written anywhere;
- the Trainer's read-only state, on the Fabric that ``self.trainer`` reads through:
  ``global_step`` (the optimizer steps taken), ``current_epoch`` 0 (dl-ci trains on one batch),
  the loop flags and the batch counts;
- a logger whose ``experiment`` takes any call and does nothing.
"""

from __future__ import annotations

import importlib
import numbers
import traceback
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from dlci.training.guard import UserCodeError, frames_text, shown_path, user_frame

DEFAULT_MAX_EPOCHS = 1000  # a Trainer's max_epochs when neither it nor max_steps is given
# where Lightning's Fabric shim says an attribute of a Trainer is missing
UNAVAILABLE = "not available when using Fabric"
UNAVAILABLE_HINT = (
    "dl-ci runs training_step without a Trainer and gives self.trainer only its read-only "
    "state: global_step, current_epoch, logged_metrics, callback_metrics, "
    "progress_bar_metrics, num_training_batches, max_epochs, max_steps, the training/"
    "sanity_checking flags, logger and loggers; read what else you need from the module "
    "(self.hparams) or guard it with `if self._trainer is not None and not "
    "hasattr(self.trainer, 'fit_loop')`"
)


class Anything:
    """An object that takes any attribute, call or item and does nothing: the ``experiment``
    of dl-ci's logger (``add_scalar``, ``log``, ``add_histogram`` ... all accepted)."""

    def __getattr__(self, name: str) -> Anything:
        if name.startswith("__"):
            raise AttributeError(name)
        return self

    def __call__(self, *args: Any, **kwargs: Any) -> Anything:
        return self

    def __getitem__(self, key: Any) -> Anything:
        return self

    def __setitem__(self, key: Any, value: Any) -> None:
        pass

    def __bool__(self) -> bool:
        return True

    def __repr__(self) -> str:
        return "<dl-ci's stand-in experiment: every call is accepted and ignored>"


def stand_in_logger(package: str) -> Any:
    """A Fabric logger that records nothing, with an ``experiment`` that takes any call."""
    loggers = importlib.import_module(f"{package}.loggers")

    class DlciLogger(loggers.Logger):  # type: ignore[misc, name-defined]
        """dl-ci's stand-in for the Trainer's logger: nothing is written."""

        @property
        def name(self) -> str:
            return "dlci"

        @property
        def version(self) -> int:
            return 0

        @property
        def root_dir(self) -> None:
            return None

        @property
        def log_dir(self) -> None:
            return None

        @property
        def save_dir(self) -> None:
            return None

        @property
        def experiment(self) -> Anything:
            return Anything()

        def log_metrics(self, metrics: Any, step: Any = None) -> None:
            pass

        def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
            pass

    return DlciLogger()


class TrainerState:
    """The Trainer's read-only state, mixed into dl-ci's Fabric (``self.trainer`` reads the
    Fabric through Lightning's shim)."""

    dlci_step: int = 0
    dlci_batches: float = 1
    dlci_model: Any = None
    dlci_logged: dict[str, Any]
    dlci_progress: dict[str, Any]

    @property
    def global_step(self) -> int:
        return self.dlci_step

    @property
    def current_epoch(self) -> int:
        return 0

    @property
    def logged_metrics(self) -> dict[str, Any]:
        return dict(self.dlci_logged)

    @property
    def callback_metrics(self) -> dict[str, Any]:
        return dict(self.dlci_logged)

    @property
    def progress_bar_metrics(self) -> dict[str, Any]:
        return dict(self.dlci_progress)

    @property
    def num_training_batches(self) -> float:
        return self.dlci_batches

    @property
    def model(self) -> Any:
        """The module being trained (a Trainer's ``model``; no strategy wraps it here)."""
        return self.dlci_model

    @property
    def lightning_module(self) -> Any:
        return self.dlci_model

    @property
    def estimated_stepping_batches(self) -> float:
        """As a Trainer with no ``max_steps`` and its default ``max_epochs`` (1000) counts
        them: the training batches times 1000. dl-ci's runs take a few hundred steps, so a
        schedule sized by this (OneCycleLR's total steps) never runs out."""
        return self.dlci_batches * DEFAULT_MAX_EPOCHS

    training = True
    sanity_checking = False
    validating = testing = predicting = False
    is_last_batch = False
    max_epochs: int | None = None
    min_epochs: int | None = None
    max_steps = -1
    accumulate_grad_batches = 1
    log_every_n_steps = 50
    fast_dev_run = False
    num_devices = 1
    num_nodes = 1
    precision = "32-true"


def is_metric(value: Any) -> bool:
    """A torchmetrics ``Metric`` (found by class, so torchmetrics is never imported here)."""
    return any(
        cls.__name__ == "Metric" and cls.__module__.startswith("torchmetrics")
        for cls in type(value).__mro__
    )


def _is_collection(value: Any) -> bool:
    return any(
        cls.__name__ == "MetricCollection" and cls.__module__.startswith("torchmetrics")
        for cls in type(value).__mro__
    )


def _logged_value(name: str, value: Any) -> Any:
    """The value a Trainer would log on the step, or None (a metric not yet called);
    a ValueError with Lightning's message for what a Trainer refuses."""
    import torch

    if is_metric(value):
        cache = getattr(value, "_forward_cache", None)
        return cache.detach() if isinstance(cache, torch.Tensor) else cache
    if isinstance(value, Mapping):
        raise ValueError(
            f"`self.log({name}, {value})` was called, but nested dictionaries cannot be logged"
        )
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(
                f"`self.log({name}, {value})` was called, but the tensor must have a single "
                f"element. You can try doing `self.log({name}, {value}.mean())`"
            )
        return value.detach().squeeze()
    if isinstance(value, numbers.Number):
        return value
    raise ValueError(
        f"`self.log({name}, {value})` was called, but `{type(value).__name__}` values "
        "cannot be logged"
    )


def _refused(exc: ValueError, step: int) -> Exception:
    """What a Trainer refuses to log, as an error located at the user's ``self.log`` call
    (raised inside dl-ci, it would otherwise read as dl-ci's own failure)."""
    summaries = traceback.extract_stack()[:-2]  # up to the user's call of self.log
    frame = user_frame(summaries)
    return UserCodeError(
        f"step {step}: train_step raised ValueError: {exc}",
        file=shown_path(frame.filename) if frame else None,
        line=frame.lineno if frame else None,
        hint="the error is in your code (Lightning's Trainer refuses it too); "
        + frames_text(summaries),
    )


def _bind(fabric: TrainerState) -> tuple[Any, Any]:
    """``log`` and ``log_dict`` for a module of this step."""

    def log(
        name: str,
        value: Any,
        prog_bar: bool = False,
        logger: bool | None = None,
        *args: Any,
        **kwargs: Any,
    ) -> None:
        try:
            logged = _logged_value(name, value)
        except ValueError as exc:
            raise _refused(exc, fabric.dlci_step + 1) from None
        if logged is None:
            return
        fabric.dlci_logged[name] = logged
        if prog_bar:
            fabric.dlci_progress[name] = logged

    def log_dict(
        dictionary: Any,
        prog_bar: bool = False,
        logger: bool | None = None,
        *args: Any,
        **kwargs: Any,
    ) -> None:
        items = (
            dictionary.items()
            if _is_collection(dictionary) or isinstance(dictionary, Mapping)
            else None
        )
        if items is None:
            raise _refused(
                ValueError(
                    f"`self.log_dict({dictionary})` was called, but it takes a dict or a "
                    "MetricCollection"
                ),
                fabric.dlci_step + 1,
            )
        for name, value in list(items):
            log(name, value, prog_bar)

    return log, log_dict


@contextmanager
def trainer_state(module: Any, base: type, fabric: TrainerState) -> Iterator[None]:
    """For one step: ``self.log``/``log_dict`` as above on the module and the LightningModules
    inside it, and ``global_step``/``current_epoch`` read from the Fabric."""
    modules = [m for m in module.modules() if isinstance(m, base)]
    log, log_dict = _bind(fabric)
    before = [(m, m.__dict__.get("_trainer")) for m in modules]
    for m in modules:
        m.__dict__["log"] = log
        m.__dict__["log_dict"] = log_dict
        # a Trainer is attached, so global_step and current_epoch read self.trainer, which
        # is Lightning's shim over the Fabric while the Fabric is set
        m.__dict__["_trainer"] = fabric
    try:
        yield
    finally:
        for m, trainer in before:
            m.__dict__.pop("log", None)
            m.__dict__.pop("log_dict", None)
            m.__dict__["_trainer"] = trainer
