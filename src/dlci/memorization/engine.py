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
from dataclasses import dataclass, field
from typing import Any

from dlci.errors import DlciError
from dlci.ladder.goal import Goal, smoothed
from dlci.ladder.model import Tier
from dlci.memorization.before import Before, measure_before
from dlci.memorization.curve import FLAT_STEPS, FLAT_TOLERANCE, PLATEAU_GAIN, PLATEAU_STEPS
from dlci.memorization.floor import ASSUMED
from dlci.memorization.verdict import (
    MemorizeResult,
    judge,
    partial,
    stuck_reason,
    training_time,
)
from dlci.memorization.watchdog import Watchdog
from dlci.training.batching import shard, take_batch, to_device
from dlci.training.draws import Draws
from dlci.training.guard import user_code
from dlci.training.regularization import Switched, no_dropout, switch_off_regularization
from dlci.training.stepping import DETACHED_HINT, Stepper, loss_value, optimizer_hparams
from dlci.training.target import Target, build_optimizer

__all__ = ["MemorizeConfig", "MemorizeResult", "Stops", "memorize", "training_time"]

StepCallback = Callable[[int, float, float], None]  # (step, loss, best loss)
StartCallback = Callable[[list[str]], None]  # the changes made before the first step
StuckCallback = Callable[[MemorizeResult], None]  # the watchdog's partial result
OTHER_RANKS_LAG_S = 10.0  # rank 0 reports a stuck run; the others end after it


@dataclass(frozen=True)
class MemorizeConfig:
    max_epochs: int
    max_loss: float | None  # absolute; None: the row states only a relative threshold
    time_cap_s: float
    batch_size: int = 16
    max_relative_loss: float | None = None  # share of the starting loss (goal.py)
    seed: int = 0
    early_stop: bool = True
    device: str | None = None  # None: the local GPU when there is one, else the CPU

    @classmethod
    def from_tier(cls, tier: Tier, **overrides: Any) -> MemorizeConfig:
        values: dict[str, Any] = {
            "max_epochs": tier.max_epochs,
            "max_loss": tier.max_loss,
            "time_cap_s": tier.time_cap_minutes * 60,
            "batch_size": tier.batch_size,
            "max_relative_loss": getattr(tier, "max_relative_loss", None),
        }
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)


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
    goal: Goal
    changes: list[str]
    hparams: dict[str, Any]
    setup_s: float
    draws: Draws
    before: Before
    switched: Switched


@dataclass
class _Trained:
    losses: list[float]
    best: float
    best_step: int
    stopped_by: str
    wall_s: float
    unjudged: str | None = None  # why the loss could not be judged against its start


@dataclass
class _Live:
    """What the run has done so far, for the watchdog's partial result (its own thread)."""

    losses: list[float] = field(default_factory=list)
    step: int = 0  # the step in progress; 0 before the first
    prepared: _Prepared | None = None


def memorize(
    target: Target,
    config: MemorizeConfig,
    *,
    on_step: StepCallback | None = None,
    on_start: StartCallback | None = None,
    dist: Distributed | None = None,
    on_stuck: StuckCallback | None = None,
) -> MemorizeResult:
    """Overfit one batch of ``target`` under ``config``; never raises for a failed test.

    ``on_start`` receives the changes made to the target (dropout, weight decay) and what was
    measured (memorization/before.py) before the first step; ``on_step`` receives each
    step's loss. With ``on_stuck``, a watchdog holds the time cap inside a step: past it,
    ``on_stuck`` gets the partial result (the stuck thread's stack in it) and the process
    exits 1 (watchdog.py); without, nothing watches.
    """
    dist = dist or Distributed()
    live = _Live()
    dog = _watchdog(config, dist, live, on_stuck)
    # the loop checks the cap between steps; the watchdog is for a step that outlives it by the
    # grace, so a step that ends just past the cap still stops the ordinary way
    lag = watchdog_grace(config.time_cap_s) + (0.0 if dist.rank == 0 else OTHER_RANKS_LAG_S)
    with deterministic():
        try:
            if dog is not None:
                dog.arm(config.time_cap_s + lag)
            prepared = live.prepared = _prepare(target, config, dist)
            if on_start is not None:
                on_start([*prepared.changes, *prepared.before.lines])
            if dog is not None:
                dog.arm(config.time_cap_s + lag)  # the cap counts the training steps
            try:
                trained = _train(prepared, config, dist, on_step, live)
            finally:
                prepared.switched.restore()
        finally:
            if dog is not None:
                dog.stop()
    losses, best = trained.losses, trained.best
    return judge(
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
        goal=prepared.goal,
        unjudged=trained.unjudged,
        before=prepared.before,
    )


def watchdog_grace(cap_s: float) -> float:
    """How long past the cap a step may still run before the watchdog calls it stuck.

    >>> watchdog_grace(1.2), watchdog_grace(600.0)
    (5.0, 30.0)
    """
    return min(max(5.0, 0.05 * cap_s), 30.0)


def _watchdog(
    config: MemorizeConfig, dist: Distributed, live: _Live, on_stuck: StuckCallback | None
) -> Any:
    """The watchdog of a run that has ``on_stuck``; None without."""
    if on_stuck is None:
        return None

    def expired(stuck_at: str, stack: list[str]) -> None:
        losses, prepared = list(live.losses), live.prepared
        known: dict[str, Any] = {"world_size": dist.world_size, "stuck_at": stuck_at}
        if prepared is not None:
            known.update(device=str(prepared.device), batch_examples=prepared.examples)
            known.update(changes=prepared.changes, hparams=prepared.hparams)
        reason = stuck_reason(config, live.step, losses, stuck_at)
        on_stuck(partial(stopped_by="watchdog", reason=reason, losses=losses, stack=stack, **known))

    return Watchdog(expired)


def _prepare(target: Target, config: MemorizeConfig, dist: Distributed) -> _Prepared:
    """Seed, take the batch, move it and the model to the device, build the optimizer."""
    setup_start = time.perf_counter()
    seed_everything(config.seed + dist.rank)
    device = pick_device(config.device, dist.local_rank)
    with user_code("train_loader"):
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
    with user_code("the optimizer factory"):
        optimizer = build_optimizer(target.optimizer, target.model)  # DDP shares its parameters
    hparams = optimizer_hparams(optimizer)  # as the user configured it, before changes
    switched = switch_off_regularization(model, optimizer)
    draws = Draws.capture()  # every step runs on these draws (training/draws.py)
    try:
        before = measure_before(target, model, batch, examples, draws)
    except BaseException:
        switched.restore()
        raise
    refs = before.references
    floor, blind = refs.floor, refs.blind
    if dist.active:
        floor, blind = _all_reduce_references(floor, blind, device, dist.world_size)
    return _Prepared(
        device=device,
        examples=examples,
        stepper=Stepper(target, model, optimizer, batch),
        goal=Goal(
            config.max_loss,
            config.max_relative_loss,
            None if refs.floor_source == ASSUMED else floor,
            blind,
        ),
        changes=switched.changes,
        hparams=hparams,
        setup_s=time.perf_counter() - setup_start,
        draws=draws,
        before=before,
        switched=switched,
    )


def _train(
    prepared: _Prepared,
    config: MemorizeConfig,
    dist: Distributed,
    on_step: StepCallback | None,
    live: _Live,
) -> _Trained:
    """The training loop: one step per epoch until memorised, the epochs or the time cap.

    Step 1's loss is computed on the batch before the first update: the start every later
    loss is measured against (goal.py). Every step runs on the same random draws, with every
    dropout call at p = 0, and is judged on the median of its last steps (goal.smoothed). A
    loss that cannot be judged against its start (below 0 with no floor) stops the run at
    once, and so does one that has not moved at all in FLAT_STEPS steps: training on could
    not change the verdict.
    """
    losses = live.losses
    best, best_step = math.inf, 0
    stops = Stops(prepared.goal, config.early_stop, prepared.before.still_random)
    stopped_by = "epochs"
    start = time.perf_counter()
    for step in range(1, config.max_epochs + 1):
        live.step = step
        prepared.draws.replay()
        with no_dropout():
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
        stop = stops.after(losses)
        if stop is not None:
            stopped_by = stop
            break
        if timed_out:
            stopped_by = "time"
            break
    return _Trained(
        losses, best, best_step, stopped_by, time.perf_counter() - start, stops.unjudged
    )


@dataclass
class Stops:
    """When the loop stops after a finite step's loss, before its epochs or time run out:
    the engine's rules, shared with the runs where the user's own loop steps (dl-ci's script
    mode). ``after`` gives the reason to stop (unjudged, threshold, flat, plateau) or None."""

    goal: Goal
    early_stop: bool = True
    still_random: bool = False
    unjudged: str | None = None  # why the loss could not be judged against its start
    plateau: _Plateau = field(default_factory=lambda: _Plateau())

    def after(self, losses: list[float]) -> str | None:
        step, start = len(losses), losses[0]
        self.unjudged = self.goal.unjudged(start, losses[-1])
        if self.unjudged is not None:
            return "unjudged"
        if not self.early_stop:
            return None
        if self.goal.met(start, smoothed(losses), step):
            return "threshold"
        if _flat(losses, self.still_random):
            return "flat"
        if self.plateau.reached(self.goal.relative(start, smoothed(losses)), step):
            return "plateau"
        return None


def _all_reduce(value: float, timed_out: bool, device: Any, world: int) -> tuple[float, bool]:
    """Average the loss and OR the time-out over ranks, so every rank takes the same decision."""
    import torch
    import torch.distributed as torch_dist

    packed = torch.tensor([value, 1.0 if timed_out else 0.0], dtype=torch.float64, device=device)
    torch_dist.all_reduce(packed)
    return float(packed[0]) / world, bool(packed[1] > 0)


@dataclass
class _Plateau:
    """The best judged relative loss so far and the step it came; ``reached`` when it has
    not closed PLATEAU_GAIN of its remaining distance to the floor in PLATEAU_STEPS steps.

    >>> plateau = _Plateau()
    >>> [plateau.reached(0.6, step) for step in (2, 30, 152, 153)]
    [False, False, False, True]
    >>> plateau = _Plateau()
    >>> [plateau.reached(0.6 * 0.999**step, step) for step in range(2, 300)][-1]  # 9.5% a 100
    False
    """

    best: float = math.inf
    since: int = 1

    def reached(self, relative: float | None, step: int) -> bool:
        if relative is None or step < 2:
            return False
        if relative < self.best * (1 - PLATEAU_GAIN) or self.best == math.inf:
            self.best, self.since = relative, step
        return step - self.since > PLATEAU_STEPS


def _flat(losses: list[float], still_random: bool) -> bool:
    """Whether the loss has not moved at all in FLAT_STEPS steps on replayed draws.

    >>> _flat([0.7] * 26, False), _flat([0.7] * 25 + [0.69], False), _flat([0.7] * 26, True)
    (True, False, False)
    """
    if still_random or len(losses) <= FLAT_STEPS:
        return False
    start = losses[0]
    tolerance = FLAT_TOLERANCE * max(abs(start), 1e-12)
    return all(abs(v - start) <= tolerance for v in losses)


def _all_reduce_references(
    floor: float | None, blind: float | None, device: Any, world: int
) -> tuple[float | None, float | None]:
    """Each rank measured its own shard: the mean of each, or None where a rank has none."""
    import torch
    import torch.distributed as torch_dist

    values = [math.nan if v is None else v for v in (floor, blind)]
    packed = torch.tensor(values, dtype=torch.float64, device=device)
    torch_dist.all_reduce(packed)
    mean = [float(v) / world for v in packed]
    return tuple(v if math.isfinite(v) else None for v in mean)  # type: ignore[return-value]
