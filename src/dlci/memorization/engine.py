"""The memorization engine: overfit one small batch until the loss falls below a threshold.

A training loop that cannot drive the loss of 16 examples towards zero cannot learn at all:
a detached output, a loss on the wrong tensors, a learning rate off by orders of magnitude.
The engine stops as soon as the threshold is reached (a PR pays only for the epochs it
needs) and fails, with the best loss and its step, when the epoch or time cap runs out.
"""

from __future__ import annotations

import math
import os
import random
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

from dlci.errors import DlciError
from dlci.memorization.batching import shard, take_batch, to_device
from dlci.memorization.stepping import (
    DETACHED_HINT,
    Stepper,
    loss_value,
    optimizer_hparams,
    switch_off_regularization,
)
from dlci.memorization.target import Target

StepCallback = Callable[[int, float, float], None]  # (step, loss, best loss)
StartCallback = Callable[[list[str]], None]  # the changes made before the first step


@dataclass(frozen=True)
class MemorizeConfig:
    max_epochs: int
    max_loss: float
    time_cap_s: float
    batch_size: int = 16
    seed: int = 0
    early_stop: bool = True
    device: str | None = None  # None: the local GPU when there is one, else the CPU

    @classmethod
    def from_tier(cls, tier: Any, **overrides: Any) -> MemorizeConfig:
        values = {
            "max_epochs": tier.max_epochs,
            "max_loss": tier.max_loss,
            "time_cap_s": tier.time_cap_minutes * 60,
            "batch_size": tier.batch_size,
        }
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)


@dataclass
class MemorizeResult:
    verdict: str  # "pass" or "fail"
    stopped_by: str  # threshold, epochs, time, nonfinite
    reason: str
    steps: int
    best_loss: float | None
    best_step: int | None
    final_loss: float | None
    losses: list[float]
    wall_time_s: float
    setup_time_s: float
    device: str
    world_size: int
    batch_examples: int
    changes: list[str] = field(default_factory=list)
    hparams: dict[str, Any] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return self.verdict == "pass"

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["losses"] = [_json_float(v) for v in self.losses]
        for key in ("best_loss", "final_loss"):
            data[key] = _json_float(data[key])
        return data


def _json_float(value: float | None) -> float | str | None:
    """JSON has no NaN or infinity: write them as text so the report stays valid JSON."""
    if value is None or math.isfinite(value):
        return value
    return str(value)


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch (all devices)."""
    import torch

    random.seed(seed)
    try:
        import numpy as np

        np.random.seed(seed)
    except ImportError:  # pragma: no cover
        pass
    torch.manual_seed(seed)


@contextmanager
def deterministic() -> Any:
    """Deterministic algorithms where torch allows (warn, not fail), restored afterwards."""
    import torch

    previous = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        torch.backends.cudnn.benchmark,
    )
    # cuBLAS needs this before its first use to be deterministic on CUDA >= 10.2
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.benchmark = False
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(previous[0], warn_only=previous[1])
        torch.backends.cudnn.benchmark = previous[2]


def pick_device(requested: str | None, local_rank: int = 0) -> Any:
    import torch

    if requested:
        try:
            device = torch.device(requested)
        except RuntimeError as exc:
            raise DlciError(
                f"--device {requested!r}: {exc}", hint="use cpu, cuda or cuda:N"
            ) from None
        if device.type == "cuda" and not torch.cuda.is_available():
            raise DlciError(
                f"--device {requested}: no CUDA device is available here",
                hint="use --device cpu, or leave --device out to use the GPU when there is one",
            )
        return device
    if torch.cuda.is_available():
        return torch.device("cuda", local_rank % torch.cuda.device_count())
    return torch.device("cpu")


@dataclass
class Distributed:
    """This process's place in a DDP run (world_size 1: not distributed)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @classmethod
    def from_env(cls) -> Distributed:
        return cls(
            rank=int(os.environ.get("RANK", 0)),
            world_size=int(os.environ.get("WORLD_SIZE", 1)),
            local_rank=int(os.environ.get("LOCAL_RANK", 0)),
        )

    @property
    def active(self) -> bool:
        return self.world_size > 1


@dataclass
class _Prepared:
    """What one run trains: the batch and model on the device, and the stepper that trains them."""

    device: Any
    examples: int
    stepper: Stepper
    changes: list[str]
    hparams: dict[str, Any]
    setup_s: float


@dataclass
class _Trained:
    losses: list[float]
    best: float
    best_step: int
    stopped_by: str
    wall_s: float


def memorize(
    target: Target,
    config: MemorizeConfig,
    *,
    on_step: StepCallback | None = None,
    on_start: StartCallback | None = None,
    dist: Distributed | None = None,
) -> MemorizeResult:
    """Overfit one batch of ``target`` under ``config``; never raises for a failed test.

    ``on_start`` receives the changes made to the target (dropout, weight decay) before the
    first step; ``on_step`` receives each step's loss.
    """
    dist = dist or Distributed()
    with deterministic():
        prepared = _prepare(target, config, dist)
        if on_start is not None:
            on_start(list(prepared.changes))
        trained = _train(prepared, config, dist, on_step)
    losses, best = trained.losses, trained.best
    return _result(
        config,
        losses=losses,
        best=best if losses and math.isfinite(best) else None,
        best_step=trained.best_step or None,
        stopped_by=trained.stopped_by,
        wall=trained.wall_s,
        setup=prepared.setup_s,
        device=str(prepared.device),
        dist=dist,
        examples=prepared.examples,
        changes=prepared.changes,
        hparams=prepared.hparams,
    )


def _prepare(target: Target, config: MemorizeConfig, dist: Distributed) -> _Prepared:
    """Seed, take the batch, move it and the model to the device, build the optimizer."""
    setup_start = time.perf_counter()
    seed_everything(config.seed + dist.rank)
    device = pick_device(config.device, dist.local_rank)
    batch, examples = take_batch(target.train_loader, config.batch_size)
    if dist.active:
        if examples < dist.world_size:
            raise DlciError(
                f"the batch has {examples} examples, fewer than the {dist.world_size} processes",
                hint="raise batch_size in the ladder, or lower nproc",
            )
        batch = shard(batch, dist.rank, dist.world_size)
    batch = to_device(batch, device)
    model = target.model.to(device)
    model.train()
    if dist.active:
        from torch.nn.parallel import DistributedDataParallel

        ids = [device.index] if device.type == "cuda" else None
        model = DistributedDataParallel(model, device_ids=ids)
    trainable = [p for p in model.parameters() if p.requires_grad]
    if not trainable:
        raise DlciError("the model has no trainable parameters", hint=DETACHED_HINT)
    optimizer = target.optimizer(trainable)
    hparams = optimizer_hparams(optimizer)  # as the user configured it, before changes
    changes = switch_off_regularization(model, optimizer)
    return _Prepared(
        device=device,
        examples=examples,
        stepper=Stepper(target, model, optimizer, batch),
        changes=changes,
        hparams=hparams,
        setup_s=time.perf_counter() - setup_start,
    )


def _train(
    prepared: _Prepared, config: MemorizeConfig, dist: Distributed, on_step: StepCallback | None
) -> _Trained:
    """The training loop: one step per epoch until the threshold, the epochs or the time cap."""
    losses: list[float] = []
    best, best_step = math.inf, 0
    stopped_by = "epochs"
    start = time.perf_counter()
    for step in range(1, config.max_epochs + 1):
        value = loss_value(prepared.stepper(step), step)
        timed_out = time.perf_counter() - start > config.time_cap_s
        if dist.active:
            value, timed_out = _all_reduce(value, timed_out, prepared.device, dist.world_size)
        losses.append(value)
        if not math.isfinite(value):
            stopped_by = "nonfinite"
            break
        if value < best:
            best, best_step = value, step
        if on_step is not None:
            on_step(step, value, best)
        if config.early_stop and value < config.max_loss:
            stopped_by = "threshold"
            break
        if timed_out:
            stopped_by = "time"
            break
    return _Trained(losses, best, best_step, stopped_by, time.perf_counter() - start)


def _all_reduce(value: float, timed_out: bool, device: Any, world: int) -> tuple[float, bool]:
    """Average the loss and OR the time-out over ranks, so every rank takes the same decision."""
    import torch
    import torch.distributed as torch_dist

    packed = torch.tensor([value, 1.0 if timed_out else 0.0], dtype=torch.float64, device=device)
    torch_dist.all_reduce(packed)
    return float(packed[0]) / world, bool(packed[1] > 0)


def training_time(wall: float, setup: float) -> str:
    """What the verdict's time counts: the training steps, then with dl-ci's set-up before them.

    >>> training_time(3.21, 0.3)
    'in 3.2 s of training (3.5 s with the set-up of batch, model and optimizer)'
    """
    total = wall + setup
    return (
        f"in {wall:.1f} s of training ({total:.1f} s with the set-up of batch, model and optimizer)"
    )


def _result(
    config: MemorizeConfig,
    *,
    losses: list[float],
    best: float | None,
    best_step: int | None,
    stopped_by: str,
    wall: float,
    setup: float,
    device: str,
    dist: Distributed,
    examples: int,
    changes: list[str],
    hparams: dict[str, Any],
) -> MemorizeResult:
    steps = len(losses)
    final = losses[-1] if losses else None
    threshold = f"{config.max_loss:g}"
    best_text = f"best {best:.4g} at step {best_step}" if best is not None else "no finite loss"
    reached = best is not None and best < config.max_loss
    timing = training_time(wall, setup)
    if stopped_by == "threshold":
        verdict, reason = "pass", f"loss {final:.4g} < {threshold} at step {steps} {timing}"
    elif stopped_by == "nonfinite":
        verdict = "fail"
        reason = f"the loss is {final} at step {steps} ({best_text}); stopped at once"
    elif reached:  # early stop switched off: the same criterion, judged after all epochs
        verdict, reason = "pass", f"loss reached {threshold}: {best_text} of {steps} {timing}"
    elif stopped_by == "time":
        verdict = "fail"
        reason = (
            f"time cap of {config.time_cap_s / 60:g} min reached at step {steps} of "
            f"{config.max_epochs}: {best_text}, threshold {threshold}"
        )
    else:
        verdict = "fail"
        reason = (
            f"the loss did not reach {threshold} in {config.max_epochs} epochs: {best_text}, "
            f"final {final:.4g}"
        )
    return MemorizeResult(
        verdict=verdict,
        stopped_by=stopped_by,
        reason=reason,
        steps=steps,
        best_loss=best,
        best_step=best_step,
        final_loss=final,
        losses=losses,
        wall_time_s=round(wall, 4),
        setup_time_s=round(setup, 4),
        device=device,
        world_size=dist.world_size,
        batch_examples=examples,
        changes=changes,
        hparams=hparams,
    )
