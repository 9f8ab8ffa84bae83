"""Record torch.profiler traces of real training steps.

Two ways in:

- :func:`profile_target` runs the steps of a ``dlci.Target`` (what ``dlci profile`` does):
  real batches from its ``train_loader``, each step annotated ``dlci/data``,
  ``dlci/forward``, ``dlci/backward`` and ``dlci/optimizer`` (or ``dlci/train_step`` around a
  user's own ``train_step``);
- :class:`Profiler` (``dlci.profile(...)``), a context for a user's own loop::

      with dlci.profile(out="dlci-artifacts") as prof:
          for inputs, targets in loader:
              with prof.phase("forward"):
                  loss = loss_fn(model(inputs), targets)
              with prof.phase("backward"):
                  loss.backward()
              with prof.phase("optimizer"):
                  opt.step()
                  opt.zero_grad()
              if prof.step():  # False once the active steps are recorded
                  break

Both use a schedule (wait, warmup, active), so every recorded step carries a
``ProfilerStep#N`` marker, and write ``trace.json.gz`` (gzipped by torch because of the
name; Perfetto and chrome://tracing open it).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dlci.errors import DlciError
from dlci.profiling.native_stderr import NativeStderr

TRACE_NAME = "trace.json.gz"
MEMORY_TRACE_NAME = "trace-memory.json.gz"  # the memory pass's own trace (memcapture.py)
LOG_NAME = "profiler.log"  # what torch.profiler printed on fd 2 (native_stderr.py)
PHASES = ("data", "forward", "backward", "optimizer", "train_step")


@dataclass
class Schedule:
    wait: int = 1
    warmup: int = 1
    active: int = 5

    def __post_init__(self) -> None:
        for name in ("wait", "warmup", "active"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise DlciError(f"profile {name} must be a whole number >= 0, got {value!r}")
        if self.active < 1:
            raise DlciError("profile needs at least 1 active step", hint="use --steps 3")

    @property
    def total(self) -> int:
        return self.wait + self.warmup + self.active

    def phase_of(self, step: int) -> str:
        """What the profiler does at step ``step`` (from 1): wait, warmup or record.

        >>> [Schedule(wait=1, warmup=1, active=2).phase_of(s) for s in range(1, 5)]
        ['wait', 'warmup', 'record', 'record']
        """
        if step <= self.wait:
            return "wait"
        return "warmup" if step <= self.wait + self.warmup else "record"


def _activities(device: Any) -> list[Any]:
    from torch.profiler import ProfilerActivity

    activities = [ProfilerActivity.CPU]
    if getattr(device, "type", str(device)).startswith("cuda"):
        activities.append(ProfilerActivity.CUDA)
    return activities


def _experimental_config() -> Any:
    """CUDA sync events (cudaStreamSynchronize and friends as device events) where supported."""
    try:
        from torch._C._profiler import _ExperimentalConfig

        return _ExperimentalConfig(enable_cuda_sync_events=True)
    except (ImportError, TypeError):  # older torch: no such option
        return None


def _torch_profile(
    schedule: Schedule, device: Any, on_ready: Callable[[Any], None], *, memory: bool = False
) -> Any:
    """``memory``: record every allocation (``profile_memory``), for the memory pass only."""
    import torch.profiler

    kwargs: dict[str, Any] = {
        "activities": _activities(device),
        "schedule": torch.profiler.schedule(
            wait=schedule.wait, warmup=schedule.warmup, active=schedule.active, repeat=1
        ),
        "on_trace_ready": on_ready,
        "record_shapes": False,
        "with_stack": False,
        "profile_memory": memory,
    }
    config = _experimental_config()
    if config is not None and torch.profiler.ProfilerActivity.CUDA in kwargs["activities"]:
        kwargs["experimental_config"] = config
    return torch.profiler.profile(**kwargs)


class _TraceWriter:
    """torch.profiler's ``on_trace_ready``: the trace goes to a temporary name, then into place."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.written = False

    def __call__(self, prof: Any) -> None:
        tmp = self.path.with_name(".partial." + self.path.name)
        prof.export_chrome_trace(str(tmp))
        tmp.replace(self.path)
        self.written = True


class Profiler:
    """A schedule-driven torch.profiler for a user's own loop; see the module docstring."""

    def __init__(
        self,
        out: str | Path = "dlci-artifacts",
        *,
        steps: int = 5,
        wait: int = 1,
        warmup: int = 1,
        device: Any = None,
        analyze: bool = True,
    ) -> None:
        self.schedule = Schedule(wait=wait, warmup=warmup, active=steps)
        self.out = Path(out)
        self.trace_path = self.out / TRACE_NAME
        self.analyze = analyze
        self.device = device
        self.steps_taken = 0
        self.report: dict[str, Any] | None = None
        self.log: Path | None = None  # torch.profiler's own messages, when it printed any
        self._prof: Any = None
        self._writer = _TraceWriter(self.trace_path)
        self._stderr = NativeStderr(self.out / LOG_NAME)

    def __enter__(self) -> Profiler:
        import torch

        device = self.device
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.out.mkdir(parents=True, exist_ok=True)
        self._prof = _torch_profile(self.schedule, torch.device(device), self._writer)
        self._stderr.__enter__()
        with self._stderr.held():
            self._prof.__enter__()
        return self

    def step(self) -> bool:
        """Mark the end of a training step. False once every active step is recorded."""
        with self._stderr.held():
            _stamp(self._prof, self.steps_taken + 1, self.schedule)
            self._prof.step()
        self.steps_taken += 1
        return self.steps_taken < self.schedule.total

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Annotate a part of the step: data, forward, backward or optimizer."""
        if name not in PHASES:
            raise DlciError(f"unknown profile phase {name!r}", hint=f"use one of {PHASES}")
        import torch.profiler

        with torch.profiler.record_function(f"dlci/{name}"):
            yield

    def __exit__(self, *exc: Any) -> None:
        with self._stderr.held():
            self._prof.__exit__(*exc)
        if exc[0] is not None:
            self._stderr.replay()
            self._stderr.discard()
        else:
            self.log = self._stderr.keep_if_any()
        self._stderr.__exit__()
        if exc[0] is not None:
            return
        if not self._writer.written:
            raise DlciError(
                f"no trace was recorded: the loop ran {self.steps_taken} steps, and the "
                f"schedule waits {self.schedule.wait} and warms up {self.schedule.warmup} "
                "before it records",
                hint="run more steps, or lower wait/warmup",
            )
        if self.analyze:
            from dlci.profiling.metrics import analyze
            from dlci.profiling.reader import read_trace

            self.report = analyze(read_trace(self.trace_path), source=str(self.trace_path))


def profile(out: str | Path = "dlci-artifacts", **kwargs: Any) -> Profiler:
    """``with dlci.profile(out=...) as prof:`` around a training loop; see :class:`Profiler`."""
    return Profiler(out, **kwargs)


@dataclass
class ProfileResult:
    trace: Path
    steps: int
    device: str
    cpu_only: bool
    wall_time_s: float
    log: Path | None = None  # torch.profiler's own messages, when it printed any


def _batches(loader: Any, needed: int) -> Iterator[Any]:
    """Batches from the loader, starting it again when it runs out."""
    produced = 0
    while produced < needed:
        empty = True
        for batch in loader:
            empty = False
            yield batch
            produced += 1
            if produced >= needed:
                return
        if empty:
            raise DlciError(
                "the target's train_loader yielded no batches", hint="check the dataset's size"
            )


class _Trainer:
    """The target's model and optimizer on the device, and one annotated training step; every
    call into the target's code guarded (memorization/guard.py)."""

    def __init__(self, target: Any, device: str | None, seed: int) -> None:
        from dlci.memorization.engine import pick_device, seed_everything
        from dlci.memorization.guard import user_code

        seed_everything(seed)
        self.target = target
        self.device = pick_device(device)
        self.model = target.model.to(self.device)
        self.model.train()
        trainable = [p for p in self.model.parameters() if p.requires_grad]
        if not trainable:
            raise DlciError("the model has no trainable parameters")
        with user_code("the optimizer factory"):
            self.optimizer = target.optimizer(trainable)

    def step(self, batches: Iterator[Any], step: int) -> None:
        """Step ``step`` (from 1), each part in its ``dlci/...`` annotation."""
        from torch.profiler import record_function as record

        from dlci.memorization.batching import as_pair, call_model, to_device
        from dlci.memorization.guard import user_code

        target, dev = self.target, self.device
        with record("dlci/data"):
            with user_code("train_loader", step):
                batch = next(batches)
            inputs, targets = as_pair(batch, step - 1)
            inputs, targets = to_device(inputs, dev), to_device(targets, dev)
        if target.train_step is not None:
            with record("dlci/train_step"), user_code("train_step", step):
                target.train_step(self.model, (inputs, targets), self.optimizer)
            return
        with record("dlci/forward"):
            with user_code("the model", step):
                outputs = call_model(self.model, inputs)
            with user_code("loss_fn", step):
                loss = target.loss_fn(outputs, targets)
        with record("dlci/backward"), user_code("backward", step):
            loss.backward()
        with record("dlci/optimizer"), user_code("the optimizer", step):
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)


def _remove_stale(out: Path) -> None:
    """An earlier run's trace and report go first: a run that ends inside the target's code
    (os._exit) must leave no trace or report that could pass for its own."""
    from dlci.profiling.analysis import REPORT_NAME

    for name in (TRACE_NAME, MEMORY_TRACE_NAME, REPORT_NAME):
        path = out / name
        if path.is_file() or path.is_symlink():
            path.unlink()


def profile_target(
    target: Any,
    *,
    out: Path,
    schedule: Schedule,
    device: str | None = None,
    seed: int = 0,
    on_step: Callable[[int, int], None] | None = None,
) -> ProfileResult:
    """Train ``target`` for ``schedule.total`` steps under torch.profiler; write the trace.

    What torch.profiler prints on fd 2 goes to OUT/profiler.log (kept when not empty), or
    to the console instead when a step fails.
    """
    import torch

    trainer = _Trainer(target, device, seed)
    dev = trainer.device
    out.mkdir(parents=True, exist_ok=True)
    _remove_stale(out)
    writer = _TraceWriter(out / TRACE_NAME)
    start = time.perf_counter()
    with NativeStderr(out / LOG_NAME) as native:
        try:
            prof = _torch_profile(schedule, dev, writer)
            with native.held():
                prof.__enter__()
            try:
                batches = _batches(target.train_loader, schedule.total)
                for step in range(1, schedule.total + 1):
                    trainer.step(batches, step)
                    with native.held():
                        _stamp(prof, step, schedule)
                        prof.step()
                    if on_step is not None:
                        on_step(step, schedule.total)
            finally:
                with native.held():
                    prof.__exit__(None, None, None)
        except BaseException:
            native.replay()  # what the profiler said may explain the failure
            native.discard()
            raise
        log = native.keep_if_any()
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    if not writer.written:
        raise DlciError("torch.profiler wrote no trace", hint="report this with the log")
    return ProfileResult(
        trace=writer.path,
        steps=schedule.active,
        device=str(dev),
        cpu_only=dev.type != "cuda",
        wall_time_s=time.perf_counter() - start,
        log=log,
    )


def _stamp(prof: Any, step: int, schedule: Any) -> None:
    """Write torch's version into the trace's header during the first recorded step (only
    then does torch.profiler keep metadata): ``dlci diff`` flags traces of other versions."""
    if step == schedule.wait + schedule.warmup + 1:
        import torch

        prof.add_metadata("dlci_torch_version", torch.__version__)
