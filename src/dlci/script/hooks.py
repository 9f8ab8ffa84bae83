"""The hooks script mode installs in the user's process before the script starts.

- ``DataLoader.__iter__``: every loader yields its real batches (its own iterator:
  samplers, ``drop_last``, ``pin_memory`` and workers as configured) until the first
  ``backward()``; the batch of that first step is recorded, with the random state at its
  yield, and every later iteration of its loader yields a copy of it once: one batch per
  epoch, ``overfit_batches=1``'s meaning (a loader without a length, an IterableDataset's
  stream, yields it at every ``next()``). Every other DataLoader (evaluation) yields its
  first batch only from then on, as ``overfit_batches`` limits them too. The profile leaves
  every loader alone.
- ``torch.autograd.backward`` (what ``Tensor.backward`` calls): the value of the tensor each
  step calls it on; a ``GradScaler``'s scaled loss is read unscaled, so accelerate's
  ``backward`` (a division by its accumulation steps, then the scaler or a plain backward) is
  read too; tensors given their gradients count ``sum(tensor * gradient)``. The losses of
  one step add up: the step's objective.
- a global optimizer step hook: one step per ``optimizer.step()`` that ran (a GradScaler that
  skips an overflowing step is not a step).
- what script mode cannot follow stops the script at once with a located message: a second
  optimizer, a step with no ``backward()`` before it, no DataLoader iterated before the first
  ``backward()``, ``DistributedDataParallel`` or a process group.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import runpy
import sys
import traceback
import warnings
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from dlci.script.command import TARGET_DOC

_HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the dlci package


class ScriptStop(BaseException):
    """dl-ci ends the script: a verdict was reached, or the profile is recorded. A
    BaseException, so a script's ``except Exception`` does not swallow it."""


class Unsupported(BaseException):  # a stop, like ScriptStop
    """What script mode cannot follow, located at the script's line."""

    def __init__(self, message: str, where: str, hint: str = TARGET_DOC) -> None:
        super().__init__(message)
        self.message, self.where, self.hint = message, where, hint


def user_frame(frames: list[traceback.FrameSummary] | None = None) -> str:
    """``file:line`` of the innermost frame of the script's own code: outside torch, dl-ci
    and the standard library, and outside installed packages where there is such a frame (a
    Lightning or accelerate loop calls what the hook saw from the script's ``fit``)."""
    import torch

    skip = (os.path.dirname(torch.__file__), _HERE, os.path.dirname(os.__file__))
    stack = list(reversed(traceback.extract_stack() if frames is None else frames))
    for installed in (False, True):
        for frame in stack:
            name = os.path.abspath(frame.filename)
            if name.startswith(skip) or frame.filename.startswith("<"):
                continue
            if not installed and f"{os.sep}site-packages{os.sep}" in name:
                continue
            return f"{_relative(frame.filename)}:{frame.lineno}"
    return ""


def _relative(path: str) -> str:
    try:
        relative = os.path.relpath(path)
    except ValueError:  # pragma: no cover - another drive on Windows
        return path
    return path if relative.startswith("..") else relative


def clone(batch: Any) -> Any:
    """A copy of every tensor of a batch (nested tuples, lists, dicts, named tuples), so an
    in-place change the script makes to one epoch's batch does not reach the next."""
    import torch

    if isinstance(batch, torch.Tensor):
        return batch.clone()
    if isinstance(batch, dict):
        return type(batch)((k, clone(v)) for k, v in batch.items())
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*(clone(v) for v in batch))
    if isinstance(batch, tuple | list):
        return type(batch)(clone(v) for v in batch)
    return batch


def examples_in(batch: Any) -> int:
    """The first dimension of the batch's first tensor (0: none)."""
    import torch

    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.ndim else 1
    values = batch.values() if isinstance(batch, dict) else batch
    if isinstance(values, tuple | list) or isinstance(batch, dict):
        for value in values:
            found = examples_in(value)
            if found:
                return found
    return 0


@dataclass
class Hooks:
    """The hooks' state; the callables are the gate's (gate.py) or the profile's (child.py)."""

    memorise: bool  # False: the profile (real batches, no loss needed)
    on_step: Callable[[float], None]
    on_batch: Callable[[], None] = lambda: None  # any loader's batch, before the first step
    before_step: Callable[[], None] = lambda: None  # before each memorised batch is yielded
    on_decided: Callable[[Any], None] = lambda _draws: None  # the memorised batch is known
    capture: Callable[[], Any] = lambda: None  # the draws at a batch's yield
    candidate: tuple[Any, Any, Any, str] | None = None  # (loader, batch, draws, where)
    on_optimizer: Callable[[Any], None] = lambda _optimizer: None  # its first step
    loader: Any = None
    batch: Any = None
    batch_at: str = ""
    optimizer: Any = None
    optimizer_at: str = ""
    steps: int = 0
    pending: list[float] = field(default_factory=list)
    parsed: list[tuple[str, str]] = field(default_factory=list)  # the script's argparse
    in_backward: bool = False
    stepped: float | None = None  # the last step's loss, judged at the next step or the end
    _optimizer_phase: Any = None
    scaled: list[tuple[Any, float]] = field(default_factory=list)  # (scaled tensor, loss)
    _undo: list[Callable[[], None]] = field(default_factory=list)

    def install(self) -> None:
        import torch
        import torch.distributed
        from torch.utils.data import DataLoader

        self._patch(DataLoader, "__iter__", self._iterate)
        self._patch(torch.autograd, "backward", self._backward)
        self._patch(torch.amp.GradScaler, "scale", self._scale)
        self._patch(argparse.ArgumentParser, "parse_known_args", self._parse_known_args)
        self._patch(torch.nn.parallel.DistributedDataParallel, "__init__", self._ddp)
        if torch.distributed.is_available():
            self._patch(torch.distributed, "init_process_group", self._process_group)
        from torch.optim.optimizer import (
            register_optimizer_step_post_hook,
            register_optimizer_step_pre_hook,
        )

        pre = register_optimizer_step_pre_hook(self._pre_step)
        post = register_optimizer_step_post_hook(self._post_step)
        self._undo += [pre.remove, post.remove]

    def uninstall(self) -> None:
        while self._undo:
            self._undo.pop()()

    def _patch(self, owner: Any, name: str, make: Callable[[Any], Any]) -> None:
        original = getattr(owner, name)
        setattr(owner, name, make(original))
        self._undo.append(lambda: setattr(owner, name, original))

    # -- the loader ---------------------------------------------------------------------
    def _iterate(self, original: Any) -> Any:
        hooks = self

        def __iter__(loader: Any) -> Iterator[Any]:
            if not hooks.memorise:
                return original(loader)  # type: ignore[no-any-return]
            if hooks.loader is None:
                return hooks._watch(loader, original(loader))
            if loader is hooks.loader:
                return hooks._again()
            return _first_only(original(loader))

        return __iter__

    def _watch(self, loader: Any, iterator: Any) -> Iterator[Any]:
        """A loader's real batches until the first backward() names the memorised one: the
        last batch yielded before it (an evaluation before training is not memorised). Its
        epoch then ends (or, endless, goes on with the memorised batch)."""
        while True:
            if self.loader is not None and loader is self.loader:
                del iterator  # its workers stop
                if not _has_length(loader):
                    yield from self._again()
                return
            try:
                batch = next(iterator)
            except StopIteration:
                return
            if self.loader is None:
                self.candidate = (loader, clone(batch), self.capture(), user_frame())
                self.on_batch()
            yield batch

    def _decide(self) -> None:
        """At the first backward(): the batch of the step it ends is the memorised batch."""
        if self.candidate is None:
            raise Unsupported(
                "backward() was called before any torch.utils.data.DataLoader was iterated: "
                "script mode memorises the batch of the first step from its DataLoader, and "
                "this script takes its batches another way (a get_batch of its own, tensors "
                "sliced by hand)",
                user_frame(),
            )
        self.loader, self.batch, draws, where = self.candidate
        self.batch_at = where or "the script"
        self.candidate = None
        self.on_decided(draws)

    def _again(self) -> Iterator[Any]:
        """One batch per iteration; for ever where the loader has no length (an
        IterableDataset's stream: the script calls next() on it without an epoch's end)."""
        endless = not _has_length(self.loader)
        while True:
            self.before_step()
            yield clone(self.batch)
            if not endless:
                return

    # -- the loss -----------------------------------------------------------------------
    def _scale(self, original: Any) -> Any:
        hooks = self

        def scale(scaler: Any, outputs: Any) -> Any:
            import torch

            scaled = original(scaler, outputs)
            if isinstance(outputs, torch.Tensor) and outputs.numel() == 1:
                hooks.scaled.append((weakref.ref(scaled), float(outputs.detach())))
            return scaled

        return scale

    def _backward(self, original: Any) -> Any:
        hooks = self

        def backward(tensors: Any, *args: Any, **kwargs: Any) -> Any:
            if hooks.in_backward:  # reentrant (checkpointing inside a backward)
                return original(tensors, *args, **kwargs)
            grads = args[0] if args else kwargs.get("grad_tensors")
            hooks._record(tensors, grads)
            hooks.in_backward = True
            try:
                with hooks._phase("backward"):
                    return original(tensors, *args, **kwargs)
            finally:
                hooks.in_backward = False

        return backward

    def _record(self, tensors: Any, grads: Any = None) -> None:
        """The value of what this backward() differentiates: a scalar loss (a GradScaler's
        unscaled), or ``sum(tensor * grad)`` for tensors given their gradients."""
        import torch

        if self.memorise and self.loader is None:
            self._decide()
        many = list(tensors) if isinstance(tensors, tuple | list) else [tensors]
        given = list(grads) if isinstance(grads, tuple | list) else [grads] * len(many)
        total = 0.0
        for tensor, grad in zip(many, given, strict=False):
            if not isinstance(tensor, torch.Tensor):
                total = float("nan")
                continue
            if isinstance(grad, torch.Tensor):
                total += float((tensor.detach() * grad.detach()).sum())
                continue
            for ref, loss in self.scaled:
                if ref() is tensor:
                    total += loss
                    break
            else:
                total += float(tensor.detach().sum()) if tensor.numel() == 1 else float("nan")
        self.scaled.clear()
        self.pending.append(total)

    # -- the step -----------------------------------------------------------------------
    def _pre_step(self, optimizer: Any, _args: Any, _kwargs: Any) -> None:
        if self.optimizer is None:
            self.optimizer, self.optimizer_at = optimizer, user_frame() or "the script"
            self.on_optimizer(optimizer)
        elif optimizer is not self.optimizer:
            first = type(self.optimizer).__name__
            raise Unsupported(
                f"a second optimizer ({type(optimizer).__name__}) stepped, after the first "
                f"({first}, stepped at {self.optimizer_at}): script mode follows one "
                "optimizer and the loss of one backward() per step (a GAN, an actor-critic "
                "or a model trained in parts have several)",
                user_frame(),
            )
        self.flush()  # the last step is judged once this one is known to be the same optimizer's
        if not self.memorise:
            self._optimizer_phase = self._phase("optimizer")
            self._optimizer_phase.__enter__()

    def _post_step(self, optimizer: Any, _args: Any, _kwargs: Any) -> None:
        self.steps += 1
        if not self.memorise:
            if self._optimizer_phase is not None:
                self._optimizer_phase.__exit__(None, None, None)
                self._optimizer_phase = None
            self.on_step(float("nan"))
            return
        if not self.pending:
            raise Unsupported(
                f"the optimizer stepped (step {self.steps}) with no backward() since the last "
                "step: script mode reads the loss from the tensor each step calls backward() "
                "on (torch.autograd.grad, or gradients set by hand, give it none)",
                user_frame(),
            )
        self.stepped = sum(self.pending)
        self.pending.clear()

    def _phase(self, name: str) -> Any:
        """The profile's annotation of a part of the step (``dlci/backward``,
        ``dlci/optimizer``, as a Target's steps are annotated); nothing when memorising."""
        if self.memorise:
            return contextlib.nullcontext()
        from torch.profiler import record_function

        return record_function(f"dlci/{name}")

    def flush(self) -> None:
        """Hand the last step's loss to the gate (which may stop the script): at the next
        step, or at the script's end."""
        if self.stepped is not None:
            value, self.stepped = self.stepped, None
            self.on_step(value)

    # -- what script mode cannot follow ---------------------------------------------------
    def _ddp(self, original: Any) -> Any:
        def init(module: Any, *args: Any, **kwargs: Any) -> None:
            raise Unsupported(
                "the script wraps its model in DistributedDataParallel: script mode follows "
                "one process",
                user_frame(),
                hint=f"{TARGET_DOC}; dlci memorize --nproc N runs a Target under torchrun",
            )

        return init

    def _process_group(self, original: Any) -> Any:
        def init_process_group(*args: Any, **kwargs: Any) -> None:
            raise Unsupported(
                "the script starts a torch.distributed process group: script mode follows "
                "one process",
                user_frame(),
                hint=f"{TARGET_DOC}; dlci memorize --nproc N runs a Target under torchrun",
            )

        return init_process_group

    def _parse_known_args(self, original: Any) -> Any:
        hooks = self

        def parse_known_args(parser: Any, *args: Any, **kwargs: Any) -> Any:
            namespace, extras = original(parser, *args, **kwargs)
            for action in parser._actions:
                value = getattr(namespace, action.dest, None)
                if action.option_strings and isinstance(value, int) and not isinstance(value, bool):
                    hooks.parsed.append((max(action.option_strings, key=len), str(value)))
                elif not action.option_strings and isinstance(value, int):
                    hooks.parsed.append((action.dest, str(value)))
            return namespace, extras

        return parse_known_args


def _has_length(loader: Any) -> bool:
    try:
        len(loader)
    except TypeError:
        return False
    return True


def _first_only(iterator: Any) -> Iterator[Any]:
    """Another DataLoader (evaluation): its first batch only."""
    try:
        yield next(iterator)
    except StopIteration:
        return
    finally:
        del iterator


def find_model(optimizer: Any) -> list[Any]:
    """The modules whose parameters the optimizer trains, outermost only (gc's live objects:
    the script keeps its model in a variable of its own)."""
    import torch

    ids = {id(p) for group in optimizer.param_groups for p in group["params"]}
    candidates = [
        obj
        for obj in _live_objects()
        if isinstance(obj, torch.nn.Module) and any(id(p) in ids for p in obj.parameters())
    ]
    inner = {id(m) for c in candidates for m in c.modules() if m is not c}
    return [m for m in candidates if id(m) not in inner]


def find_optimizers() -> list[Any]:
    import torch

    found: dict[int, Any] = {}  # a wrapper sharing its optimizer's param_groups is the same
    for obj in _live_objects():
        if isinstance(obj, torch.optim.Optimizer):
            key = id(obj.param_groups)
            if key not in found or type(obj).__module__.startswith("torch."):
                found[key] = obj  # the torch class, not a wrapper's subclass (LightningAdam)
    return list(found.values())


def find_schedulers(optimizer: Any) -> list[Any]:
    """The learning-rate schedulers of ``optimizer`` (held: the script's end frees them)."""
    import torch

    kinds = (torch.optim.lr_scheduler.LRScheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)
    return [obj for obj in _live_objects() if isinstance(obj, kinds) and obj.optimizer is optimizer]


def _live_objects() -> list[Any]:
    """gc's objects; the isinstance checks on them stay quiet (a deprecated module proxy
    warns when asked its class)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return [obj for obj in gc.get_objects() if _is_torch_object(obj)]


def _is_torch_object(obj: Any) -> bool:
    """A module, optimizer or scheduler itself: not a weakref.proxy to one (Lightning's
    trainer holds its LightningModule by one; a proxy passes isinstance as its referent
    does, and would stand for the model under another id)."""
    import torch

    if isinstance(obj, weakref.ProxyTypes):
        return False
    kinds = (torch.nn.Module, torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler)
    return isinstance(obj, (*kinds, torch.optim.lr_scheduler.ReduceLROnPlateau))


def run_script(script: str, module: bool, args: list[str]) -> None:
    """Run the script as ``python script args`` / ``python -m module args`` would."""
    if module:
        sys.argv = [script, *args]
        runpy.run_module(script, run_name="__main__", alter_sys=True)
        return
    sys.argv = [script, *args]
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    runpy.run_path(script, run_name="__main__")
