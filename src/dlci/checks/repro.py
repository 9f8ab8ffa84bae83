"""reproducibility: the same seed gives the same parameters; DataLoader workers seeded."""

from __future__ import annotations

import copy
import math
from typing import Any

from dlci.checks.base import FAIL, PASS, WARN, CheckResult, Context, number
from dlci.memorization.engine import seed_everything
from dlci.training.target import Target, build_optimizer

STEPS = 3


def reproducibility(ctx: Context) -> CheckResult:
    if ctx.factory is not None:  # rebuild the target from its function, twice, same seed
        runs = []
        for _ in range(2):
            seed_everything(0)
            target = ctx.factory()
            model = target.model.to(ctx.device)
            runs.append(_train(ctx, model, target))  # its own step: state kept in a closure
        how = "two builds of the target with seed 0"
    else:  # the same starting point twice: the training step itself must be deterministic
        start = copy.deepcopy(ctx.model.state_dict())
        runs = []
        for _ in range(2):
            ctx.model.load_state_dict(start)
            seed_everything(0)
            runs.append(_train(ctx, ctx.model, ctx.target))
        how = "two runs from the same weights with seed 0"
    worst = max((_difference(a, b) for a, b in zip(runs[0], runs[1], strict=True)), default=0.0)
    measured = f"largest parameter difference {worst:.2g} after {STEPS} steps ({how})"
    tolerance = ctx.policy.threshold("reproducibility", "tolerance")
    expected = f"identical within {number(tolerance)}"
    workers = _unseeded_workers(ctx.target.train_loader)
    if worst > tolerance:
        return CheckResult(
            "reproducibility",
            FAIL,
            measured,
            expected,
            cause="the same seed does not give the same model: an unseeded generator in the "
            "target's code, or nondeterministic kernels",
            fix="build everything after seeding (no torch.seed()/time-based seeds); use "
            "torch.use_deterministic_algorithms(True) to find nondeterministic kernels",
        )
    if workers:
        return CheckResult(
            "reproducibility",
            WARN,
            measured + f"; {workers}",
            expected,
            cause="DataLoader workers without a generator or worker_init_fn repeat NumPy's "
            "random state across workers",
            fix="pass generator=torch.Generator().manual_seed(seed) and a worker_init_fn that "
            "seeds NumPy and random from torch.initial_seed()",
        )
    return CheckResult("reproducibility", PASS, measured, expected)


def _difference(a: Any, b: Any) -> float:
    """The largest difference: equal values (NaN on both sides too) count 0, a NaN on one side
    counts as infinitely far (a NaN would otherwise compare as "within 1e-6")."""
    import torch

    if a.numel() == 0:
        return 0.0
    a, b = a.float(), b.float()
    diff = (a - b).abs()
    same = (a == b) | (torch.isnan(a) & torch.isnan(b))
    return float(torch.where(same, 0.0, diff.nan_to_num(nan=math.inf, posinf=math.inf)).max())


def _train(ctx: Context, model: Any, target: Target) -> list[Any]:
    model.train()
    optimizer = build_optimizer(target.optimizer, model)
    for _ in range(STEPS):
        ctx.step(model, optimizer, target=target)
    return [p.detach().clone() for p in model.parameters()]


def _unseeded_workers(loader: Any) -> str:
    workers = getattr(loader, "num_workers", 0) or 0
    if (
        workers > 0
        and getattr(loader, "worker_init_fn", None) is None
        and getattr(loader, "generator", None) is None
    ):
        return f"{workers} DataLoader workers without a generator or worker_init_fn"
    return ""
