"""optimizer-coverage: an optimizer that is not given every trainable parameter."""

from __future__ import annotations

from dlci.checks.base import FAIL, PASS, CheckResult, Context, layer_name


def optimizer_coverage(ctx: Context) -> CheckResult:
    trainable = {id(p): name for name, p in ctx.model.named_parameters() if p.requires_grad}
    optimizer = ctx.optimizer()
    covered = {id(p) for group in optimizer.param_groups for p in group["params"]}
    missing = [name for key, name in trainable.items() if key not in covered]
    measured = f"{len(trainable) - len(missing)} of {len(trainable)} trainable tensors"
    if not missing:
        return CheckResult("optimizer-coverage", PASS, measured, "all trainable tensors")
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
