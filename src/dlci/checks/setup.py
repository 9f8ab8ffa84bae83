"""optimizer-coverage: an optimizer that is not given every trainable parameter."""

from __future__ import annotations

from dlci.checks.base import FAIL, PASS, CheckResult, Context, layer_name
from dlci.training.copying import model_copy


def optimizer_coverage(ctx: Context) -> CheckResult:
    trainable = {id(p): name for name, p in ctx.model.named_parameters() if p.requires_grad}
    optimizer = ctx.optimizer()
    covered = {id(p) for group in optimizer.param_groups for p in group["params"]}
    missing = [name for key, name in trainable.items() if key not in covered]
    measured = f"{len(trainable) - len(missing)} of {len(trainable)} trainable tensors"
    if not missing:
        return _given_parameters(ctx) or CheckResult(
            "optimizer-coverage", PASS, measured, "all trainable tensors"
        )
    layers = sorted({layer_name(n) for n in missing})
    return CheckResult(
        "optimizer-coverage",
        FAIL,
        measured,
        "all trainable tensors",
        cause=f"the optimizer never updates {', '.join(layers[:6])}",
        fix="build the optimizer from the params dl-ci passes (lambda params: Adam(params, ...)) "
        "or from model.parameters(); freeze on purpose with requires_grad=False",
        details={"missing": missing},
    )


def _given_parameters(ctx: Context) -> CheckResult | None:
    """A factory must build its optimizer over the parameters it is given: every copy the
    checks train (and the user's own copies) needs one of its own. One that closes over the
    model (``lambda params: model.configure_optimizers(...)``) trains the original instead."""
    twin = model_copy(ctx.model)
    given = {id(p) for p in twin.parameters() if p.requires_grad}
    held = [p for group in ctx.optimizer(twin).param_groups for p in group["params"]]
    if not held or all(id(p) in given for p in held):
        return None
    original = {id(p) for p in ctx.model.parameters()}
    theirs = sum(id(p) in original for p in held)
    measured = (
        f"given a copy's {len(given)} trainable tensors, the factory returned an optimizer over "
        f"{len(held)} others" + (f", {theirs} of them the model's own" if theirs else "")
    )
    return CheckResult(
        "optimizer-coverage",
        FAIL,
        measured,
        "an optimizer over the parameters the factory is given",
        cause="the optimizer factory does not use its argument"
        + (": it closes over the model, so training a copy updates the original" if theirs else ""),
        fix="build the optimizer from the factory's argument: lambda params: AdamW(params, ...); "
        "a method that reads self.parameters() (nanoGPT's configure_optimizers) needs its "
        "groups built from params instead (docs/target.md shows how)",
        details={"given": len(given), "held": len(held), "the_models_own": theirs},
    )
