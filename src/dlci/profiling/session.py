"""One torch.profiler recording of a target's training steps: the trace session that the timed
pass (capture.py), the memory pass (memcapture.py) and the batch size estimate (batchfit.py,
its Trainer only) share.

:class:`TraceSession` builds the target's :class:`Trainer` (its model and optimizer on the
device, every call into the target's code guarded), runs ``schedule.total`` annotated steps
under ``torch.profiler`` with the :class:`Schedule`, writes the trace through
:class:`TraceWriter` (a temporary name, then into place) and keeps what torch.profiler printed
on fd 2 in a log (native_stderr.py), replayed on the console instead when a step fails.
Nothing here imports torch at module level.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from dlci.errors import DlciError
from dlci.memorization.engine import pick_device, seed_everything
from dlci.profiling.native_stderr import NativeStderr
from dlci.training.batching import as_pair, call_model, to_device
from dlci.training.guard import user_code
from dlci.training.target import build_optimizer

TRACE_NAME = "trace.json.gz"
MEMORY_TRACE_NAME = "trace-memory.json.gz"  # the memory pass's own trace (memcapture.py)
LOG_NAME = "profiler.log"  # what torch.profiler printed on fd 2 (native_stderr.py)


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


def activities(device: Any) -> list[Any]:
    from torch.profiler import ProfilerActivity

    activities = [ProfilerActivity.CPU]
    if getattr(device, "type", str(device)).startswith("cuda"):
        activities.append(ProfilerActivity.CUDA)
    return activities


def experimental_config() -> Any:
    """CUDA sync events (cudaStreamSynchronize and friends as device events) where supported."""
    try:
        from torch._C._profiler import _ExperimentalConfig

        return _ExperimentalConfig(enable_cuda_sync_events=True)
    except (ImportError, TypeError):  # older torch: no such option
        return None


def torch_profile(
    schedule: Schedule, device: Any, on_ready: Callable[[Any], None], *, memory: bool = False
) -> Any:
    """``memory``: record every allocation (``profile_memory``), for the memory pass only."""
    import torch.profiler

    kwargs: dict[str, Any] = {
        "activities": activities(device),
        "schedule": torch.profiler.schedule(
            wait=schedule.wait, warmup=schedule.warmup, active=schedule.active, repeat=1
        ),
        "on_trace_ready": on_ready,
        "record_shapes": False,
        "with_stack": False,
        "profile_memory": memory,
    }
    config = experimental_config()
    if config is not None and torch.profiler.ProfilerActivity.CUDA in kwargs["activities"]:
        kwargs["experimental_config"] = config
    return torch.profiler.profile(**kwargs)


class TraceWriter:
    """torch.profiler's ``on_trace_ready``: the trace goes to a temporary name, then into place."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.written = False

    def __call__(self, prof: Any) -> None:
        tmp = self.path.with_name(".partial." + self.path.name)
        prof.export_chrome_trace(str(tmp))
        tmp.replace(self.path)
        self.written = True


def batches(loader: Any, needed: int) -> Iterator[Any]:
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


class Trainer:
    """The target's model and optimizer on the device, and one annotated training step; every
    call into the target's code guarded (training/guard.py)."""

    def __init__(self, target: Any, device: str | None, seed: int) -> None:
        seed_everything(seed)
        self.target = target
        self.device = pick_device(device)
        self.model = target.model.to(self.device)
        self.model.train()
        trainable = [p for p in self.model.parameters() if p.requires_grad]
        if not trainable:
            raise DlciError("the model has no trainable parameters")
        with user_code("the optimizer factory"):
            self.optimizer = build_optimizer(target.optimizer, self.model)

    def step(self, batches: Iterator[Any], step: int) -> None:
        """Step ``step`` (from 1), each part in its ``dlci/...`` annotation."""
        from torch.profiler import record_function as record

        target, dev = self.target, self.device
        with record("dlci/data"):
            with user_code("train_loader", step):
                batch = next(batches)
            inputs, targets = as_pair(batch, step - 1)
            inputs, targets = to_device(inputs, dev), to_device(targets, dev)
        if target.train_step is not None:
            with (
                record("dlci/train_step"),
                user_code("train_step", step),
                forward_marked(self.model),
            ):
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


class Meter(Protocol):
    """What measures a step (meter.PeakMeter): started before it, stopped after it."""

    def start(self) -> None: ...

    def stop(self) -> tuple[int, int | None]: ...


class TraceSession:
    """The target's steps under torch.profiler, one trace and one log; see the module docstring.

    ``memory``: record every allocation (``profile_memory``) and hold fd 2 through each step,
    since torch warns there about blocks allocated before it started.
    """

    def __init__(
        self,
        target: Any,
        *,
        schedule: Schedule,
        trace: Path,
        log: Path,
        device: str | None = None,
        seed: int = 0,
        memory: bool = False,
    ) -> None:
        self.trainer = Trainer(target, device, seed)
        self.device = self.trainer.device
        self.schedule = schedule
        self.writer = TraceWriter(trace)
        self.log_path = log
        self.memory = memory
        self.log: Path | None = None  # the log, once run, when torch.profiler printed anything
        self.peaks: tuple[int, int | None] = (0, None)  # the meter's figures for the last step

    def run(
        self,
        *,
        on_step: Callable[[int, int], None] | None = None,
        meter: Meter | None = None,
        no_trace_hint: str = "report this with the log",
    ) -> Path:
        """Train every step of the schedule; the trace's path (a located error if none)."""
        schedule = self.schedule
        steps = batches(self.trainer.target.train_loader, schedule.total)
        with NativeStderr(self.log_path) as native:
            try:
                with native.held():
                    prof = torch_profile(schedule, self.device, self.writer, memory=self.memory)
                    prof.__enter__()
                try:
                    for step in range(1, schedule.total + 1):
                        held = native.held() if self.memory else contextlib.nullcontext()
                        with held:
                            if meter is not None:
                                meter.start()
                            self.trainer.step(steps, step)
                            if meter is not None:
                                self.peaks = meter.stop()
                        with native.held():
                            if not self.memory:  # the timed trace carries torch's version
                                stamp(prof, step, schedule)
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
            self.log = native.keep_if_any()
        if not self.writer.written:
            what = "memory trace" if self.memory else "trace"
            raise DlciError(f"torch.profiler wrote no {what}", hint=no_trace_hint)
        return self.writer.path


def stamp(prof: Any, step: int, schedule: Any) -> None:
    """Write torch's version into the trace's header during the first recorded step (only
    then does torch.profiler keep metadata): ``dlci diff`` flags traces of other versions."""
    if step == schedule.wait + schedule.warmup + 1:
        import torch

        prof.add_metadata("dlci_torch_version", torch.__version__)


@contextlib.contextmanager
def forward_marked(model: Any) -> Iterator[None]:
    """Each call of ``model`` inside the block annotated ``dlci/forward``, by forward hooks:
    a user's own train_step gets its forward attributed (its backward and optimizer are
    torch's own autograd and ``Optimizer.step`` events). Calls left open by an exception
    are closed at the end of the block."""
    from torch.profiler import record_function

    opened: list[Any] = []

    def enter(module: Any, args: Any) -> None:
        mark = record_function("dlci/forward")
        mark.__enter__()  # type: ignore[no-untyped-call]
        opened.append(mark)

    def leave(module: Any, args: Any, output: Any) -> None:
        if opened:
            opened.pop().__exit__(None, None, None)

    handles = [model.register_forward_pre_hook(enter), model.register_forward_hook(leave)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
        while opened:
            opened.pop().__exit__(None, None, None)
