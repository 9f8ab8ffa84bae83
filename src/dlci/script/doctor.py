"""The doctor on the user's own script (the child's side of ``dlci doctor -- python ...``).

The checks that need only the model, the optimizer and the batch the hooks see run on the
script's own objects: ``initial-loss``, ``zero-grad``, ``grad-flow``, ``activations``,
``weight-norms`` and ``update-ratio``. They are the checks' own functions (dlci.checks, run
by ``run_checks`` on a context handed to it), not copies: what differs is the context.

- A check's training step (``ctx.step``) is the script's own next step: the checks run in a
  thread of their own, and each step they ask for lets the script's loop run until its next
  ``optimizer.step()`` returns, on the memorised batch with step 1's random draws replayed
  (hooks.py, as ``dlci memorize --`` does), while the checks wait; between steps the script
  waits. So a bug in the script's loop, loader or loss is in the steps the checks judge.
- ``ctx.optimizer()`` is the script's optimizer, its state put back to what it was before
  step 1 (a Target's check builds a fresh one); the weights are step 1's starting weights,
  put back after step 1 and after each check.
- A forward of the checks' own (activations, initial-loss) calls the model as the script
  called it at step 1: the same arguments, cloned.
- initial-loss reads the script's loss at step 1 (the loss its ``backward()`` saw), and the
  class count from the model's outputs where the batch's last tensor holds class indices.

The other checks need what only a Target gives (a loss function apart from the step,
several batches of the loaders, copies of the model trained with fresh optimizers, the
target rebuilt): they are listed, skipped, with the reason (NEEDS_A_TARGET).
"""

from __future__ import annotations

import copy
import datetime as dt
import sys
import threading
from pathlib import Path
from typing import Any

import msgspec

from dlci import jsonio
from dlci.checks import run_checks, select
from dlci.checks.base import SKIP, CheckResult, Context
from dlci.checks.doctor import pictures, policy_entry, waiver_entries
from dlci.errors import DlciError
from dlci.fsutil import atomic_write_text
from dlci.memorization.engine import seed_everything
from dlci.policy import CHECK_IDS, Policy
from dlci.report import doctor as report
from dlci.report import html
from dlci.script.command import TARGET_DOC
from dlci.script.hooks import Hooks, ScriptStop, clone, find_model, find_optimizers
from dlci.script.plan import Answer, DoctorFound, DoctorPlan
from dlci.training.batching import score_candidates, tree_map
from dlci.training.draws import Draws
from dlci.training.target import Target

#: the checks that run on the script's own objects
IN_SCRIPT_MODE = (
    "initial-loss",
    "zero-grad",
    "grad-flow",
    "activations",
    "weight-norms",
    "update-ratio",
)
_COPIES = "it trains copies of the model, each with a fresh optimizer from the Target's factory"
_LOADERS = "it reads several batches of the loaders; script mode holds the one memorised batch"
_LOSS = "it calls the loss function apart from the step; the script's loss is inside its step"
#: why each other check needs a Target
NEEDS_A_TARGET = {
    "optimizer-coverage": "it builds the optimizer from the Target's factory over a copy of "
    "the model",
    "loss-broadcast": _LOSS,
    "train-eval-mode": _COPIES,
    "shuffle": _LOADERS,
    "input-normalization": _LOADERS,
    "batch-independence": _LOADERS,
    "causality": _LOSS,
    "memorize": "dlci memorize -- python ... is this check in script mode",
    "input-dependence": _COPIES,
    "lr-range": _COPIES,
    "label-alignment": _LOADERS,
    "leakage": _LOADERS,
    "reproducibility": "it builds the target twice from its factory and compares the runs",
}


class ScriptEnded(DlciError):
    """The script ended (or failed) before the step a check asked for."""


class ScriptContext(Context):
    """The checks' context on the script's objects: its steps, its optimizer, its model call."""

    driver: Any = None

    def optimizer(self, model: Any = None) -> Any:
        if model is not None and model is not self.model:
            raise DlciError(
                "this check builds an optimizer for a copy of the model: script mode has the "
                "script's one optimizer",
                hint=TARGET_DOC,
            )
        return self.driver.fresh_optimizer()

    def step(
        self, model: Any, optimizer: Any, batch: Any = None, target: Target | None = None
    ) -> float:
        if model is not self.model or batch is not None or target is not None:
            raise DlciError(
                "this check trains a copy of the model or another batch: in script mode the "
                "script trains its own model on the memorised batch",
                hint=TARGET_DOC,
            )
        value: float = self.driver.script_step()
        return value

    def forward(self, model: Any = None, batch: Any = None) -> Any:
        if batch is not None and batch is not self.batch:
            raise DlciError("this check runs the model on a batch of its own", hint=TARGET_DOC)
        args, kwargs = self.driver.model_call()
        return (model or self.model)(*args, **kwargs)


class ScriptDoctor:
    """The doctor's driver in the child: hooks, the checks' thread, the report."""

    def __init__(self, plan: DoctorPlan) -> None:
        self.plan = plan
        seed_everything(plan.seed)
        self.hooks = Hooks(
            True,
            lambda _value: None,  # the steps are counted here (stepped), not judged
            on_batch=self.on_batch,
            before_step=self.before_step,
            on_decided=self.on_decided,
            capture=Draws.capture,
            on_optimizer=self.on_optimizer,
        )
        self.draws: Draws | None = None
        self.go = threading.Semaphore(0)  # the checks let the script take one step
        self.done = threading.Semaphore(0)  # the script took it
        self.thread: threading.Thread | None = None
        self.ended = False  # the script ended, failed or was stopped
        self.finished = False  # the checks are done
        self.first_loss: float | None = None
        self.last_loss = float("nan")
        self.start: tuple[Any, Any] | None = None  # weights, optimizer state before step 1
        self.results: list[CheckResult] = []
        self.crashes: list[BaseException] = []
        self._handles: list[Any] = []
        self.watched: set[int] = set()  # the models whose calls are watched
        self.calls: dict[int, tuple[Any, Any]] = {}  # their last call before step 1
        self.model: Any = None
        self.ctx: ScriptContext | None = None

    # -- the script's side (its thread) ------------------------------------------------------
    def __enter__(self) -> ScriptDoctor:
        from torch.optim.optimizer import register_optimizer_step_post_hook

        self._handles.append(register_optimizer_step_post_hook(self._stepped))
        return self

    def __exit__(self, *exc: Any) -> None:
        self.ended = True
        self.done.release()  # a check waiting for a step hears that none comes
        if self.thread is not None:
            self.thread.join()
        while self._handles:
            self._handles.pop().remove()

    def on_batch(self) -> None:
        """A batch before step 1: the calls of the models the optimizers that exist train
        are watched (the last one before the first backward() is step 1's; which model's
        counts is known at step 1, from the optimizer that steps)."""
        for optimizer in find_optimizers():
            for model in find_model(optimizer):
                if id(model) not in self.watched:
                    self.watched.add(id(model))
                    handle = model.register_forward_pre_hook(self._called, with_kwargs=True)
                    self._handles.append(handle)

    def _called(self, module: Any, args: Any, kwargs: Any) -> None:
        if self.hooks.loader is None:  # before the memorised batch is decided
            self.calls[id(module)] = (clone(tuple(args)), clone(dict(kwargs)))

    def on_decided(self, draws: Draws) -> None:
        self.draws = draws

    def before_step(self) -> None:
        if self.draws is not None:
            self.draws.replay()

    def on_optimizer(self, optimizer: Any) -> None:
        """Step 1 begins: the weights and the optimizer's state it starts from."""
        roots = find_model(optimizer)
        self.model = roots[0] if len(roots) == 1 else _several(roots)
        self.start = (copy.deepcopy(self.model.state_dict()), copy.deepcopy(optimizer.state_dict()))

    def _stepped(self, optimizer: Any, _args: Any, _kwargs: Any) -> None:
        """After each of the script's steps (hooks.py's post-step hook ran first): step 1
        starts the checks, every later step was one a check asked for."""
        if optimizer is not self.hooks.optimizer:
            return
        value = self.hooks.stepped
        if self.thread is None:
            self.first_loss = value
            self._put_back(optimizer)
            self.thread = threading.Thread(target=self._checks, name="dlci-doctor", daemon=True)
            self.thread.start()
        else:
            self.last_loss = float("nan") if value is None else value
            self.done.release()
        self.go.acquire()  # until a check asks for the next step, or the checks are done
        if self.finished:
            raise ScriptStop("checked")

    def _put_back(self, optimizer: Any) -> None:
        assert self.start is not None
        self.model.load_state_dict(self.start[0])
        optimizer.load_state_dict(copy.deepcopy(self.start[1]))

    # -- the checks' side (their thread) ------------------------------------------------------
    def script_step(self) -> float:
        if self.ended:
            raise self._ended()
        self.go.release()
        self.done.acquire()
        if self.ended:
            raise self._ended()
        return self.last_loss

    def _ended(self) -> ScriptEnded:
        return ScriptEnded(
            f"the script ended after {self.hooks.steps} optimizer steps, before the step this "
            "check asked for (the checks take about 20 of the script's steps)",
            hint="raise the script's own epoch or step count",
        )

    def fresh_optimizer(self) -> Any:
        """The script's optimizer, its state as before step 1: a fresh one, as a Target's."""
        optimizer = self.hooks.optimizer
        assert self.start is not None
        optimizer.load_state_dict(copy.deepcopy(self.start[1]))
        return optimizer

    @property
    def call(self) -> tuple[Any, Any] | None:
        """The model's last call before the first backward(): step 1's (read once step 1 is
        done: a step that runs its forward in a closure inside optimizer.step, as Lightning's
        does, calls the model after the step began)."""
        return self.calls.get(id(self.model))

    def model_call(self) -> tuple[Any, Any]:
        if self.call is None:
            raise DlciError(
                "the script's call of its model was not seen before step 1 (the optimizer was "
                "built after the first batch)",
                hint=TARGET_DOC,
            )
        args, kwargs = self.call
        return clone(args), clone(kwargs)

    def _checks(self) -> None:
        try:
            self.ctx = self._context()
            wanted = [c for c in select(self.plan.only) if c.id in IN_SCRIPT_MODE]
            ran = run_checks(
                self.ctx.target,
                checks=wanted,
                tier=self.ctx.tier,
                stop_on_fail=self.plan.stop_on_fail,
                on_result=self._say,
                crashes=self.crashes,
                policy=self.ctx.policy,
                today=dt.date.fromisoformat(self.plan.today),
                context=self.ctx,
            )
            self.results = ran
        except BaseException as exc:
            self.crashes.append(exc)
        finally:
            self.finished = True
            self.go.release()

    def _context(self) -> ScriptContext:
        device = next((p.device for p in self.model.parameters()), "cpu")
        batch = _on(_as_pair(self.hooks.batch), device)
        classes = _classes(self, batch)
        first = self.first_loss
        target = Target(
            model=self.model,
            optimizer=lambda _params: self.fresh_optimizer(),
            train_loader=self.hooks.loader,
            loss_fn=lambda _outputs, _targets: first,  # the script's loss at step 1
            num_classes=classes,
            train_step=_script_step,  # the script's own: zero-grad runs
        )
        policy = Policy.from_json(self.plan.policy)
        ctx = ScriptContext(target, batch, device, self.plan.tier, None, policy=policy)
        ctx.driver = self
        return ctx

    def _say(self, result: CheckResult) -> None:
        if not self.plan.quiet:
            print(f"doctor: {result.id:<20} {result.status}", file=sys.stderr, flush=True)

    # -- the report (the script's thread, after it) ----------------------------------------------
    def outcome(self) -> Answer:
        plan = self.plan
        if self.thread is None:
            return Answer(
                error=f"the script ended after {self.hooks.steps} optimizer steps, before "
                "the doctor could start: it starts at the script's first optimizer step",
                where=plan.script,
                hint="check that the command trains (not --sample-only or 0 epochs)",
            )
        for exc in self.crashes:
            if not isinstance(exc, Exception):
                raise exc
        if self.ctx is None or (self.crashes and not self.results):  # no check could run
            first = self.crashes[0] if self.crashes else None
            return Answer(
                error="the doctor could not start on the script's model and batch: "
                f"{type(first).__name__}: {first}",
                where=plan.script,
                hint=TARGET_DOC,
            )
        by_id = {r.id: r for r in self.results}
        results = []
        for check in select(plan.only):
            if check.id in by_id:
                results.append(by_id[check.id])
            elif check.id not in IN_SCRIPT_MODE:
                result = _needs_a_target(check.id)
                self._say(result)
                results.append(result)
        policy = Policy.from_json(plan.policy)
        today = dt.date.fromisoformat(plan.today)
        data = report.build(
            results,
            target=plan.spec,
            tier=plan.tier.to_dict(),
            seed=plan.seed,
            waivers=waiver_entries(policy, results, today),
            policy=policy_entry(policy),
        )
        data = msgspec.structs.replace(data, script_mode=True)
        json_path = plan.json or str(Path(plan.out) / report.REPORT_NAME)
        if json_path != "-":
            jsonio.write(json_path, data)
        if plan.markdown:
            atomic_write_text(plan.markdown, report.render_markdown(data))
        page = None
        if html.report_folder(json_path, plan.out) and self.ctx is not None:
            page = pictures(data, Path(plan.out), self.ctx.target)
        exit_code = 1 if data.verdict == "fail" else 0
        found = DoctorFound(
            report=data, json_path=json_path, exit_code=exit_code, html=str(page) if page else None
        )
        return Answer(doctor=found)

    def failed(self, text: str) -> None:
        pass  # the parent says it; the doctor's report is written once the checks ran


def _on(batch: Any, device: Any) -> Any:
    import torch

    return tree_map(lambda leaf: leaf.to(device) if isinstance(leaf, torch.Tensor) else leaf, batch)


def _needs_a_target(check_id: str) -> CheckResult:
    return CheckResult(
        check_id,
        SKIP,
        cause=f"needs a Target in script mode: {NEEDS_A_TARGET[check_id]}",
        fix="write a Target (docs/target.md) and run dlci doctor --target on it",
    )


def _script_step(_model: Any, _batch: Any, _optimizer: Any) -> Any:
    raise DlciError("the script's step runs in the script")  # ScriptContext.step calls none


def _several(roots: list[Any]) -> Any:
    import torch

    return torch.nn.ModuleList(roots)


def _as_pair(batch: Any) -> tuple[Any, Any]:
    """The memorised batch as (inputs, targets): its last element the targets (``(x, y)``,
    DLRM's ``(dense, offsets, indices, targets)``), a dict's ``labels`` or ``targets``."""
    if isinstance(batch, tuple | list) and len(batch) >= 2:
        rest = tuple(batch[:-1])
        return (rest[0] if len(rest) == 1 else rest), batch[-1]
    if isinstance(batch, dict):
        for key in ("labels", "targets", "target", "y"):
            if key in batch:
                return batch, batch[key]
    return batch, None


def _classes(driver: ScriptDoctor, batch: tuple[Any, Any]) -> int | None:
    """The class count: the width of the model's scores where the targets are class indices
    below it (None otherwise: initial-loss is skipped)."""
    import torch

    targets = batch[1]
    if not isinstance(targets, torch.Tensor) or targets.is_floating_point() or driver.call is None:
        return None
    args, kwargs = driver.model_call()
    modes = {module: module.training for module in driver.model.modules()}
    try:
        driver.model.eval()
        with torch.no_grad():
            outputs = driver.model(*args, **kwargs)
    finally:
        for module, mode in modes.items():
            module.training = mode
    for scores in score_candidates(outputs):
        if isinstance(scores, torch.Tensor) and scores.is_floating_point() and scores.ndim >= 2:
            width = int(scores.shape[-1])
            if width >= 2 and targets.numel() and int(targets.max()) < width:
                return width
    return None


assert set(IN_SCRIPT_MODE) | set(NEEDS_A_TARGET) == set(CHECK_IDS)
