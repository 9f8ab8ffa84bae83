"""The memorization gate on the script's own steps (the child's side of ``dlci memorize --``).

The engine's rules, not a copy of them: the same goal (ladder/goal.py), the same stops after
each step (engine.Stops: threshold, flat, plateau, unjudged), the same verdict
(verdict.judge). What differs is who steps: the script's own loop, on the memorised batch
(hooks.py), with the random draws replayed before each step, dropout and weight decay off.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

from dlci.ladder.goal import Goal
from dlci.memorization.before import Before
from dlci.memorization.engine import Distributed, MemorizeConfig, MemorizeResult, Stops
from dlci.memorization.floor import ASSUMED, References
from dlci.memorization.verdict import judge
from dlci.script.dropout import functional_dropout_off
from dlci.script.hooks import (
    Hooks,
    ScriptStop,
    examples_in,
    find_model,
    find_optimizers,
    find_schedulers,
)
from dlci.training.draws import Draws
from dlci.training.regularization import switch_off_regularization
from dlci.training.stepping import optimizer_hparams

SCHEDULE_NOTE = (
    "the script's learning-rate schedule stepped: {}; one memorised batch is one epoch here, "
    "so a schedule that steps once per epoch (StepLR, ExponentialLR, ReduceLROnPlateau) runs "
    "as many times faster as its loader has batches, and may decay the rate before the batch "
    "is memorised"
)
FLOOR_NOTE = "the loss is read from the script's backward(), not separable from its step"

Say = Callable[[str], None]


class ScriptGate:
    """Counts the script's steps, judges each as the engine does, stops the script."""

    def __init__(self, config: MemorizeConfig, say: Say, progress: Any) -> None:
        self.config, self.say, self.progress = config, say, progress
        self.goal = Goal(config.max_loss, config.max_relative_loss, None, None)
        self.stops = Stops(self.goal, config.early_stop, False)
        self.hooks = Hooks(
            True,
            self.on_step,
            on_batch=self.on_batch,
            before_step=self.before_step,
            on_decided=self.on_decided,
            capture=Draws.capture,
        )
        self.losses: list[float] = []
        self.best, self.best_step = math.inf, 0
        self.stopped_by = "ended"
        self.changes: list[str] = []
        self.lines: list[str] = []
        self.hparams: dict[str, Any] = {}
        self.draws: Draws | None = None
        self.started = time.perf_counter()
        self.first_step: float | None = None
        self.switched = False
        self.device = "cpu"
        self._modes = ExitStack()
        self.schedulers: list[Any] = []  # the optimizer's, found at step 1
        self.rates: list[Any] = []  # its learning rates then

    # -- before the first step -------------------------------------------------------------
    def on_batch(self) -> None:
        """A batch of any DataLoader before the first step: the first puts the dropout
        functions at p = 0; each, until done, switches the model's regularisation off once
        the script's one optimizer exists (a Lightning Trainer's validation batches come
        before it builds its optimizer)."""
        if self.first_step is None:
            self.first_step = time.perf_counter()
            self.caught = self._modes.enter_context(functional_dropout_off())  # its calls at p = 0
        if not self.switched:
            optimizers = find_optimizers()
            if len(optimizers) == 1:
                self._switch_off(optimizers[0])

    def _switch_off(self, optimizer: Any) -> None:
        import torch

        self.switched = True
        self.hparams = optimizer_hparams(optimizer)
        roots = find_model(optimizer)
        model = roots[0] if len(roots) == 1 else torch.nn.ModuleList(roots)
        self.changes += switch_off_regularization(model, optimizer).changes
        for parameter in model.parameters():
            self.device = str(parameter.device)
            break

    def on_decided(self, draws: Draws) -> None:
        """The first backward(): the batch its step trains on is memorised, and the draws
        at its yield are replayed before every later step."""
        self.draws = draws
        self.lines.insert(
            0,
            f"the memorised batch: the batch of step 1, from the DataLoader iterated at "
            f"{self.hooks.batch_at} ({examples_in(self.hooks.batch)} examples), yielded again "
            "at every iteration of it (one batch per epoch); every other DataLoader yields its "
            "first batch only from then on",
        )

    def before_step(self) -> None:
        """Before each memorised batch: the draws of step 1, replayed."""
        if self.draws is not None:
            self.draws.replay()

    # -- each step -------------------------------------------------------------------------
    def on_step(self, value: float) -> None:
        if not self.switched:  # the optimizer was built after the first batch
            self._switch_off(self.hooks.optimizer)
            self.changes.append(
                "(switched off at step 1's optimizer step: its update ran with weight decay)"
            )
        step = len(self.losses) + 1
        if step == 1:
            self._say_before()
            self.schedulers = find_schedulers(self.hooks.optimizer)
            self.rates = _rates(self.hooks.optimizer)
        self.losses.append(value)
        if not math.isfinite(value):
            self._stop("nonfinite")
        if value < self.best:
            self.best, self.best_step = value, step
        self.progress(step, value, self.best)
        stop = self.stops.after(self.losses)
        if stop is not None:
            self._stop(stop)
        if self.first_step is not None and time.perf_counter() - self.first_step > (
            self.config.time_cap_s
        ):
            self._stop("time")
        if step >= self.config.max_epochs:
            self._stop("epochs")

    def _stop(self, reason: str) -> None:
        self.stopped_by = reason
        raise ScriptStop(reason)

    def _say_before(self) -> None:
        caught = getattr(self, "caught", [])
        self.lines.append(
            f"judged against: {References(None, ASSUMED, notes=[FLOOR_NOTE]).describe()}"
        )
        self.lines += [f"dropout off: {name} called with p > 0, run with p = 0" for name in caught]
        for line in [*self.changes, *self.lines]:
            self.say(f"before training: {line}")

    # -- the verdict -----------------------------------------------------------------------
    def close(self) -> None:
        """Put back what the first batch changed (the dropout functions at p = 0)."""
        self._modes.close()

    def result(self) -> MemorizeResult:
        self.close()
        wall = time.perf_counter() - (self.first_step or time.perf_counter())
        setup = (self.first_step or self.started) - self.started
        moved = self.hooks.optimizer is not None and _rates(self.hooks.optimizer) != self.rates
        schedulers = [  # one that keeps the rate as it was (DLRM's, without warmup) is no news
            f"{type(held).__name__} ({held.last_epoch} steps)"
            for held in self.schedulers
            if held.last_epoch > 0 and moved
        ]
        if schedulers:
            self.lines.append(SCHEDULE_NOTE.format(", ".join(schedulers)))
        before = Before(References(None, ASSUMED, notes=[FLOOR_NOTE]), self.lines, False)
        result = judge(
            self.config,
            losses=self.losses,
            best=self.best if self.losses and math.isfinite(self.best) else None,
            best_step=self.best_step or None,
            stopped_by=self.stopped_by,
            wall=wall,
            setup=setup,
            device=self.device,
            dist=Distributed(),
            examples=examples_in(self.hooks.batch),
            changes=self.changes,
            hparams=self.hparams,
            goal=self.goal,
            unjudged=self.stops.unjudged,
            before=before,
        )
        if schedulers and not result.passed:
            result.next_step = f"{self.lines[-1]}; {result.next_step}".rstrip("; ")
        return result


def _rates(optimizer: Any) -> list[Any]:
    return [group.get("lr") for group in optimizer.param_groups]
