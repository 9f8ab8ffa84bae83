"""train-eval-mode: BatchNorm and Dropout in the wrong mode inside the user's own steps."""

from __future__ import annotations

from dlci.checks.base import FAIL, PASS, SKIP, WARN, CheckResult, Context


def _mode_sensitive(model):  # type: ignore[no-untyped-def]
    from torch.nn.modules.batchnorm import _BatchNorm
    from torch.nn.modules.dropout import _DropoutNd

    return [(n, m) for n, m in model.named_modules() if isinstance(m, _BatchNorm | _DropoutNd)]


def train_eval_mode(ctx: Context) -> CheckResult:
    import torch

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
    seen: dict[str, list[bool]] = {}

    def watch(name: str):  # type: ignore[no-untyped-def]
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
    expected = "eval mode in eval_step, train mode in train_step"
    if wrong_eval:
        return CheckResult(
            "train-eval-mode",
            FAIL,
            f"eval_step ran {len(wrong_eval)} layer(s) in train mode",
            expected,
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
            expected,
            cause="after an evaluation the model stays in eval mode: dropout off and BatchNorm "
            "frozen while training",
            fix="call model.train() at the start of train_step (or of every epoch)",
            details={"layers": wrong_train},
        )
    return CheckResult("train-eval-mode", PASS, "modes right in the user's steps", expected)
