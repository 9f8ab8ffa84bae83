"""train-eval-mode: BatchNorm and Dropout in the wrong mode inside the user's own steps."""

from __future__ import annotations

from typing import Any

from dlci.checks.base import FAIL, PASS, SKIP, WARN, CheckResult, Context

EXPECTED = "eval mode in eval_step, train mode in train_step"


def _mode_sensitive(model: Any) -> list[tuple[str, Any]]:
    from torch.nn.modules.batchnorm import _BatchNorm
    from torch.nn.modules.dropout import _DropoutNd

    return [(n, m) for n, m in model.named_modules() if isinstance(m, _BatchNorm | _DropoutNd)]


def train_eval_mode(ctx: Context) -> CheckResult:
    target = ctx.target
    if target.train_step is None and target.eval_step is None:
        return CheckResult(
            "train-eval-mode",
            SKIP,
            cause="no train_step or eval_step: dl-ci's own steps set the mode",
        )
    layers = _mode_sensitive(ctx.model)
    if not layers:
        return CheckResult(
            "train-eval-mode",
            SKIP,
            cause="no BatchNorm or Dropout layer, so the mode changes nothing",
        )
    wrong_eval, wrong_train = _wrong_modes(ctx, layers)
    return _verdict(wrong_eval, wrong_train)


def _wrong_modes(ctx: Context, layers: list[tuple[str, Any]]) -> tuple[list[str], list[str]]:
    """The layers eval_step ran in train mode, and those train_step ran in eval mode."""
    import torch

    target = ctx.target
    seen: dict[str, list[bool]] = {}

    def watch(name: str) -> Any:
        return lambda module, inputs: seen.setdefault(name, []).append(module.training)

    handles = [m.register_forward_pre_hook(watch(n)) for n, m in layers]
    try:
        wrong_eval: list[str] = []
        if target.eval_step is not None:
            ctx.model.train()  # as a loop leaves it after training
            with torch.no_grad():
                target.eval_step(ctx.model, ctx.batch)
            wrong_eval = [n for n, modes in seen.items() if any(modes)]
        seen.clear()
        wrong_train: list[str] = []
        if target.train_step is not None:
            ctx.model.eval()  # as a loop leaves it after evaluating
            ctx.step(ctx.model, ctx.optimizer())
            wrong_train = [n for n, modes in seen.items() if not all(modes)]
    finally:
        for handle in handles:
            handle.remove()
    return wrong_eval, wrong_train


def _verdict(wrong_eval: list[str], wrong_train: list[str]) -> CheckResult:
    if wrong_eval:
        return CheckResult(
            "train-eval-mode",
            FAIL,
            f"eval_step ran {len(wrong_eval)} layer(s) in train mode",
            EXPECTED,
            cause="evaluation uses batch statistics and dropout: scores are noisy and BatchNorm's "
            "running statistics change during evaluation",
            fix="call model.eval() at the start of eval_step (and model.train() before training)",
            details={"layers": wrong_eval},
        )
    if wrong_train:
        return CheckResult(
            "train-eval-mode",
            WARN,
            f"train_step ran {len(wrong_train)} layer(s) in eval mode",
            EXPECTED,
            cause="after an evaluation the model stays in eval mode: dropout off and BatchNorm "
            "frozen while training",
            fix="call model.train() at the start of train_step (or of every epoch)",
            details={"layers": wrong_train},
        )
    return CheckResult("train-eval-mode", PASS, "modes right in the user's steps", EXPECTED)
