"""``dlci.Target.from_lightning``: a LightningModule, and its LightningDataModule, as a Target.

dl-ci calls the module's own hooks for each batch, in the order Lightning's training loop
calls them, with no Trainer: no checkpoints, loggers, progress bar or callbacks, and every
step on the batch and the optimizer that dl-ci chose. What the module asks of its runner
(``self.optimizers()``, ``self.manual_backward``, ``self.log``, ``self.lr_schedulers()``) is
answered by a single-device ``Fabric`` with no loggers, which is Lightning's own way to run a
LightningModule without a Trainer. docs/target.md says what is reused and what is not.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from dlci.errors import DlciError
from dlci.training.adapters import PairLoader, parameters_swapped, require, unwrapped
from dlci.training.guard import user_error
from dlci.training.lightning_classes import module_num_classes
from dlci.training.lightning_optim import Scheduler, parse_configure_optimizers
from dlci.training.lightning_state import (
    UNAVAILABLE,
    UNAVAILABLE_HINT,
    TrainerState,
    stand_in_logger,
    trainer_state,
)

# the package of a LightningModule's base class -> the package of the Fabric that matches it
FABRIC_OF = {"lightning.pytorch": "lightning.fabric", "pytorch_lightning": "lightning_fabric"}


def lightning_base(module: Any) -> type:
    """The LightningModule class that ``module`` derives from (of either distribution)."""
    for cls in type(module).__mro__:
        if cls.__name__ == "LightningModule" and cls.__module__.startswith(tuple(FABRIC_OF)):
            return cls
    raise DlciError(
        f"Target.from_lightning needs a LightningModule, got {type(module).__name__}",
        hint="pass your LightningModule (lightning.pytorch or pytorch_lightning 2.x); for a plain "
        "torch.nn.Module use dlci.Target(model, optimizer, train_loader, loss_fn=...)",
    )


def from_lightning(
    module: Any,
    datamodule: Any = None,
    *,
    train_dataloaders: Any = None,
    val_dataloaders: Any = None,
    num_classes: int | None = None,
    loss_fn: Any = None,
    eval_step: Any = None,
) -> dict[str, Any]:
    """The Target of a LightningModule, as dlci.Target's keyword arguments: its
    ``training_step``, ``configure_optimizers`` and batch hooks; its data from
    ``train_dataloaders``, else the datamodule, else the module.

    ``loss_fn`` (outputs of the module's forward, targets) -> loss is optional: training runs
    ``training_step`` either way; the checks that score the model's outputs (initial-loss,
    label-alignment, leakage's held-out score) use it.

    ``eval_step`` (model, batch) -> outputs is optional too: the checks that score or probe
    the outputs call it; without it they call the module's forward on the inputs, or on the
    inputs and the targets when its forward needs both (``forward(self, inputs, target)``,
    a sequence-to-sequence model's teacher forcing).
    """
    base = lightning_base(module)
    flavour = next(name for name in FABRIC_OF if base.__module__.startswith(name))
    _setup(module, datamodule)
    train = _loader(module, datamodule, train_dataloaders, "train")
    if train is None:
        raise DlciError(
            "Target.from_lightning: no training data",
            hint="pass a LightningDataModule with train_dataloader(), train_dataloaders=..., "
            "or define train_dataloader() in the module",
        )
    val = _loader(module, datamodule, val_dataloaders, "val")
    train_view = PairLoader(train, "the training DataLoader")
    steps = LightningSteps(module, base, FABRIC_OF[flavour], train_view)
    return dict(  # the keyword arguments of dlci.Target
        model=module,
        optimizer=steps.optimizer,
        train_loader=train_view,
        val_loader=None if val is None else PairLoader(val, "the validation DataLoader"),
        loss_fn=loss_fn,
        num_classes=num_classes or module_num_classes(module, datamodule, train_view),
        train_step=steps.train_step,
        eval_step=eval_step or _forward_of_pairs(module),
    )


def _forward_of_pairs(module: Any) -> Any:
    """An eval_step that calls ``forward(inputs, targets)`` for a module whose forward takes
    two positional arguments without defaults; None for any other (one input is the rule)."""
    try:
        parameters = list(inspect.signature(module.forward).parameters.values())
    except (TypeError, ValueError):
        return None
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    required = [p for p in parameters if p.kind in positional and p.default is p.empty]
    if len(required) != 2:
        return None

    def eval_step(model: Any, batch: Any) -> Any:
        import torch

        model.eval()
        with torch.no_grad():
            return model(batch[0], batch[1])

    return eval_step


def _setup(module: Any, datamodule: Any) -> None:
    """What Lightning does before the first batch: the data prepared and set up for fitting,
    the model's layers configured."""
    if datamodule is not None:
        datamodule.prepare_data()
        datamodule.setup("fit")
    module.setup("fit")
    if hasattr(module, "configure_model"):
        module.configure_model()


def _loader(module: Any, datamodule: Any, given: Any, split: str) -> Any:
    """The split's loader: the one given, else the datamodule's, else the module's own."""
    if given is not None:
        loader = given
    else:
        loader = None
        for owner in (datamodule, module):
            if owner is not None and _overridden(owner, f"{split}_dataloader"):
                loader = getattr(owner, f"{split}_dataloader")()
                break
    if isinstance(loader, list | tuple | dict):
        if len(loader) != 1:
            raise DlciError(
                f"Target.from_lightning: {len(loader)} {split} loaders; dl-ci takes one",
                hint=f"pass the one {split} DataLoader to train on",
            )
        loader = next(iter(loader.values())) if isinstance(loader, dict) else loader[0]
    return loader


def _overridden(owner: Any, name: str) -> bool:
    """Whether ``owner``'s class defines ``name`` itself (Lightning's defaults only raise)."""
    for cls in type(owner).__mro__:
        if name in vars(cls):
            return not cls.__module__.startswith(tuple(FABRIC_OF))
    return False


@dataclass
class _OptimizerState:
    """An optimizer's schedulers from ``configure_optimizers``, and the steps it took."""

    schedulers: list[Scheduler]
    steps: int = 0


@dataclass
class LightningSteps:
    """The module's step as dl-ci runs it: the optimizer factory and ``train_step``."""

    module: Any
    base: type
    fabric_package: str
    train_view: PairLoader  # its layout turns dl-ci's (inputs, targets) back into the batch
    _fabrics: dict[str, Any] = field(default_factory=dict)
    _wrapped: tuple[Any, Any] | None = None  # the last optimizer and Fabric's wrapper of it

    def optimizer(self, params: Any) -> Any:
        """The module's ``configure_optimizers`` over ``params`` (the model's or a copy's)."""
        with parameters_swapped(self.module, list(params)), self._configuring(self.module):
            configured = self.module.configure_optimizers()
        optimizer, schedulers = parse_configure_optimizers(configured)
        optimizer.__dict__["_dlci_lightning"] = _OptimizerState(schedulers)
        return optimizer

    def train_step(self, model: Any, batch: Any, optimizer: Any) -> Any:
        """One batch as Lightning's loop runs it: the module's hooks, its ``training_step``,
        and (automatic optimisation) ``optimizer_step`` with the closure Lightning builds."""
        module = unwrapped(model, self.base)
        model.train()  # Lightning's fit loop trains in train mode: a step's own eval() shows
        batch = self.train_view.join(batch)
        state = _state(optimizer)
        try:
            with self._attached(module, optimizer) as (fabric, wrapped):
                fabric.dlci_step = state.steps
                if module.automatic_optimization:
                    return self._automatic(model, module, batch, wrapped, state)
                output = _call_step(model, module, batch)
                state.steps += 1
                return _manual_loss(output, fabric.dlci_losses)
        except AttributeError as exc:  # what Lightning's shim says a Fabric has not
            if UNAVAILABLE not in str(exc):
                raise
            raise user_error(exc, "train_step", state.steps + 1, UNAVAILABLE_HINT) from None

    def _automatic(
        self, model: Any, module: Any, batch: Any, optimizer: Any, state: _OptimizerState
    ) -> Any:
        from torch.profiler import record_function

        if module.on_train_batch_start(batch, 0) == -1:
            raise DlciError(
                "on_train_batch_start returned -1, so Lightning would skip the rest of the epoch",
                hint="dl-ci trains on every batch it gives; return None from the hook",
            )
        done: list[tuple[Any, Any]] = []

        def closure() -> Any:  # Lightning's Closure: step, zero_grad, backward, then the hooks
            output = _call_step(model, module, batch)
            loss = _automatic_loss(output)
            module.on_before_zero_grad(optimizer)
            module.optimizer_zero_grad(0, 0, optimizer)
            module.on_before_backward(loss)
            with record_function("dlci/backward"):  # the phases of `dlci profile`
                module.backward(loss)
            module.on_after_backward()
            module.on_before_optimizer_step(optimizer)
            if _overridden(module, "configure_gradient_clipping"):
                module.configure_gradient_clipping(
                    optimizer, gradient_clip_val=None, gradient_clip_algorithm=None
                )
            done.append((loss, output))
            return loss

        module.optimizer_step(0, 0, optimizer, closure)
        if not done:
            raise DlciError(
                "optimizer_step returned without calling optimizer_closure, so training_step "
                "never ran",
                hint="call optimizer.step(closure=optimizer_closure) in your optimizer_step",
            )
        loss, output = done[-1]
        module.on_train_batch_end(output if isinstance(output, dict) else {"loss": loss}, batch, 0)
        state.steps += 1
        for scheduler in state.schedulers:  # as Lightning steps them after an optimizer step
            if scheduler.steps_after(state.steps):
                module.lr_scheduler_step(scheduler.scheduler, None)
        return loss

    @contextmanager
    def _configuring(self, module: Any) -> Iterator[None]:
        """The module attached to a Fabric while ``configure_optimizers`` runs, as the
        Trainer's ``fit`` attaches it: ``self.trainer.model.parameters()`` and
        ``self.trainer.estimated_stepping_batches`` (a OneCycleLR's total steps) answer."""
        fabric = self._fabric(module)
        fabric.dlci_model = module
        module.fabric = fabric
        try:
            with trainer_state(module, self.base, fabric):
                yield
        finally:
            module.fabric = None

    @contextmanager
    def _attached(self, module: Any, optimizer: Any) -> Iterator[tuple[Any, Any]]:
        """The module attached to a Fabric for the step, so ``self.optimizers()`` gives the
        optimizer dl-ci chose; detached after, so copies and pickles carry no Fabric."""
        fabric = self._fabric(module)
        if self._wrapped is None or self._wrapped[0] is not optimizer:
            self._wrapped = (optimizer, fabric.setup_optimizers(optimizer))
        wrapped = self._wrapped[1]
        fabric.dlci_losses = []
        fabric.dlci_model = module
        # read by self.lr_schedulers() through Lightning's Trainer shim for Fabric
        fabric.lr_scheduler_configs = _state(optimizer).schedulers
        module.fabric = fabric
        module._fabric_optimizers = [wrapped]  # what Fabric.setup sets for a LightningModule
        try:
            with trainer_state(module, self.base, fabric):
                yield fabric, wrapped
        finally:
            module.fabric = None
            module._fabric_optimizers = []

    def _fabric(self, module: Any) -> Any:
        import torch

        device = next(module.parameters(), torch.zeros(0)).device
        key = str(device)
        if key not in self._fabrics:
            fabric = _recording_fabric(self.fabric_package, device)
            fabric.dlci_batches = _batches(self.train_view)
            self._fabrics[key] = fabric
        return self._fabrics[key]


def _state(optimizer: Any) -> _OptimizerState:
    state = getattr(optimizer, "_dlci_lightning", None)
    if not isinstance(state, _OptimizerState):
        raise DlciError(
            "the step was given an optimizer that the module's configure_optimizers did not build",
            hint="build optimizers with the Target's optimizer factory",
        )
    return state


def _recording_fabric(package: str, device: Any) -> Any:
    """A single-device Fabric with no loggers that remembers what the step back-propagated
    (a manual ``training_step`` may return nothing: its loss is what it passed backward)."""
    fabric_module = require(package, "lightning", "Target.from_lightning")
    strategies = importlib.import_module(f"{package}.strategies")

    class RecordingFabric(TrainerState, fabric_module.Fabric):  # type: ignore[misc, name-defined]
        dlci_losses: list[Any]

        def backward(self, tensor: Any, *args: Any, **kwargs: Any) -> None:
            self.dlci_losses.append(tensor)
            super().backward(tensor, *args, **kwargs)

    accelerator = "cuda" if device.type == "cuda" else "cpu"
    fabric = RecordingFabric(
        accelerator=accelerator,
        devices=1,
        strategy=strategies.SingleDeviceStrategy(device=device),
        loggers=[stand_in_logger(package)],  # self.logger.experiment takes any call
    )
    fabric.dlci_logged, fabric.dlci_progress = {}, {}
    return fabric


def _batches(loader: Any) -> float:
    """The Trainer's ``num_training_batches``: the loader's length, else infinity."""
    try:
        return len(loader)
    except TypeError:
        return float("inf")


def _call_step(model: Any, module: Any, batch: Any) -> Any:
    """``module.training_step(batch, 0)``; through the wrapper's forward when the model is
    wrapped (DistributedDataParallel), as Lightning's own strategies do, so its gradient
    hooks see the step."""
    from torch.profiler import record_function

    with record_function("dlci/forward"):  # backward and optimizer inside get their own phases
        if model is module:
            return module.training_step(batch, 0)
        return _through_wrapper(model, module, batch)


def _through_wrapper(model: Any, module: Any, batch: Any) -> Any:
    """``training_step`` called through the wrapper's ``forward``."""
    had = module.__dict__.get("forward")

    def restore() -> None:
        if had is None:
            module.__dict__.pop("forward", None)
        else:
            module.__dict__["forward"] = had

    def redirected(*args: Any, **kwargs: Any) -> Any:
        restore()  # training_step calls the real forward
        return module.training_step(*args, **kwargs)

    module.__dict__["forward"] = redirected
    try:
        return model(batch, 0)
    finally:
        restore()


def _automatic_loss(output: Any) -> Any:
    """The loss of an automatic ``training_step``: a tensor, or the dict's ``"loss"``."""
    loss = output.get("loss") if isinstance(output, dict) else output
    if loss is None:
        raise DlciError(
            "training_step returned no loss"
            + (" (a dict without 'loss')" if isinstance(output, dict) else " (None)")
            + ", so Lightning would skip the batch and nothing would train",
            hint="return the loss tensor, or a dict with the key 'loss'",
        )
    return loss


def _manual_loss(output: Any, backpropagated: list[Any]) -> Any:
    """The loss of a manual ``training_step``: what it returned, else what it passed to
    ``self.manual_backward`` first."""
    loss = output.get("loss") if isinstance(output, dict) else output
    if loss is not None:
        return loss
    if backpropagated:
        return backpropagated[0]
    raise DlciError(
        "training_step (manual optimisation) neither returned a loss nor called "
        "self.manual_backward(loss)",
        hint="call self.manual_backward(loss) in training_step, or return the loss",
    )
