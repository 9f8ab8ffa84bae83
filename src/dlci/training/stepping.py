"""The memorization test's step: how one step runs, the optimizer's settings as the user made
them, and the user mistakes a step turns into DlciErrors (regularization.py switches off
what would keep a batch from being memorised)."""

from __future__ import annotations

from typing import Any

from dlci.errors import DlciError
from dlci.training.batching import call_model
from dlci.training.guard import user_code
from dlci.training.target import Target

# param-group keys that choose a kernel, not a hyperparameter
_IMPLEMENTATION_FLAGS = {"params", "capturable", "differentiable", "foreach", "fused", "maximize"}


def optimizer_hparams(optimizer: Any) -> dict[str, Any]:
    """The optimizer's class and the scalar settings of its first param group."""
    group = optimizer.param_groups[0]
    values: dict[str, Any] = {"optimizer": type(optimizer).__name__}
    for key, value in group.items():
        if key in _IMPLEMENTATION_FLAGS:
            continue
        if isinstance(value, bool | int | float | str):
            values[key] = value
        elif isinstance(value, tuple) and all(isinstance(v, int | float) for v in value):
            values[key] = list(value)
    return values


DETACHED_HINT = (
    "the loss does not depend on any trainable parameter, so nothing can learn: the model's "
    "output is detached from its parameters (look for .detach(), .item(), .data, .numpy() or "
    "torch.no_grad() in forward, or parameters with requires_grad=False)"
)


def loss_value(loss: Any, step: int) -> float:
    import torch

    if isinstance(loss, int | float) and not isinstance(loss, bool):
        return float(loss)
    if not isinstance(loss, torch.Tensor):
        raise DlciError(
            f"step {step}: the loss is a {type(loss).__name__}, not a tensor or a number",
            hint="return the loss tensor from loss_fn (or from your train_step)",
        )
    if loss.numel() != 1:
        raise DlciError(
            f"step {step}: the loss has shape {tuple(loss.shape)}, not a single value",
            hint="reduce it, for example loss_fn = nn.CrossEntropyLoss() (reduction='mean')",
        )
    return float(loss.detach())


def _detached(exc: BaseException) -> str | None:
    return DETACHED_HINT if "does not require grad" in str(exc) else None


class Stepper:
    """Runs one training step: the user's own ``train_step``, or the standard one; every
    call into the user's code is guarded (training/guard.py)."""

    def __init__(self, target: Target, model: Any, optimizer: Any, batch: Any) -> None:
        self.target, self.model, self.optimizer, self.batch = target, model, optimizer, batch

    def __call__(self, step: int) -> Any:
        if self.target.train_step is not None:
            with user_code("train_step", step, _detached):
                return self.target.train_step(self.model, self.batch, self.optimizer)
        return self._standard(step)

    def _standard(self, step: int) -> Any:
        import torch

        inputs, targets = self.batch
        with user_code("the model", step):
            self.optimizer.zero_grad(set_to_none=True)
            outputs = call_model(self.model, inputs)
        with user_code("loss_fn", step):
            loss = self.target.loss_fn(outputs, targets)  # type: ignore[misc]
        loss_value(loss, step)  # shape and type checks before backward
        if not isinstance(loss, torch.Tensor):
            raise DlciError(
                f"step {step}: loss_fn returned a {type(loss).__name__}, not a tensor, so it has "
                "no gradient",
                hint="return the loss tensor itself (not loss.item() or float(loss))",
            )
        if not loss.requires_grad:
            raise DlciError(f"step {step}: the loss has no gradient", hint=DETACHED_HINT)
        with user_code("backward", step, _detached):
            loss.backward()  # type: ignore[no-untyped-call]
        with user_code("the optimizer", step):
            self.optimizer.step()
        return loss
