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

TRACE_NAME = "trace.json.gz"
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


def _torch_profile(schedule: Schedule, device: Any, on_ready: Callable[[Any], None]) -> Any:
    import torch.profiler

    kwargs: dict[str, Any] = {
        "activities": _activities(device),
        "schedule": torch.profiler.schedule(
            wait=schedule.wait, warmup=schedule.warmup, active=schedule.active, repeat=1
        ),
        "on_trace_ready": on_ready,
        "record_shapes": False,
        "with_stack": False,
    }
    config = _experimental_config()
    if config is not None and torch.profiler.ProfilerActivity.CUDA in kwargs["activities"]:
        kwargs["experimental_config"] = config
    return torch.profiler.profile(**kwargs)


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
        self._prof: Any = None
        self._written = False

    def __enter__(self) -> Profiler:
        import torch

        device = self.device
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.out.mkdir(parents=True, exist_ok=True)
        self._prof = _torch_profile(self.schedule, torch.device(device), self._export)
        self._prof.__enter__()
        return self

    def _export(self, prof: Any) -> None:
        tmp = self.trace_path.with_name(".partial." + TRACE_NAME)
        prof.export_chrome_trace(str(tmp))
        tmp.replace(self.trace_path)
        self._written = True

    def step(self) -> bool:
        """Mark the end of a training step. False once every active step is recorded."""
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
        self._prof.__exit__(*exc)
        if exc[0] is not None:
            return
        if not self._written:
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


def profile_target(
    target: Any,
    *,
    out: Path,
    schedule: Schedule,
    device: str | None = None,
    seed: int = 0,
    on_step: Callable[[int, int], None] | None = None,
) -> ProfileResult:
    """Train ``target`` for ``schedule.total`` steps under torch.profiler; write the trace."""
    import torch

    from dlci.memorization.batching import as_pair, call_model, to_device
    from dlci.memorization.engine import _user_error, pick_device, seed_everything

    seed_everything(seed)
    dev = pick_device(device)
    model = target.model.to(dev)
    model.train()
    trainable = [p for p in model.parameters() if p.requires_grad]
    if not trainable:
        raise DlciError("the model has no trainable parameters")
    optimizer = target.optimizer(trainable)
    out.mkdir(parents=True, exist_ok=True)
    trace = out / TRACE_NAME
    written: list[bool] = []

    def export(prof: Any) -> None:
        tmp = out / (".partial." + TRACE_NAME)
        prof.export_chrome_trace(str(tmp))
        tmp.replace(trace)
        written.append(True)

    record = torch.profiler.record_function
    start = time.perf_counter()
    with _torch_profile(schedule, dev, export) as prof:
        batches = _batches(target.train_loader, schedule.total)
        for step in range(1, schedule.total + 1):
            try:
                with record("dlci/data"):
                    raw = next(batches)
                    inputs, targets = as_pair(raw, step - 1)
                    inputs, targets = to_device(inputs, dev), to_device(targets, dev)
                if target.train_step is not None:
                    with record("dlci/train_step"):
                        target.train_step(model, (inputs, targets), optimizer)
                else:
                    with record("dlci/forward"):
                        outputs = call_model(model, inputs)
                        loss = target.loss_fn(outputs, targets)
                    with record("dlci/backward"):
                        loss.backward()
                    with record("dlci/optimizer"):
                        optimizer.step()
                        optimizer.zero_grad(set_to_none=True)
            except DlciError:
                raise
            except (
                RuntimeError,
                TypeError,
                ValueError,
                IndexError,
                KeyError,
                AttributeError,
            ) as exc:
                raise _user_error(step, exc) from None
            prof.step()
            if on_step is not None:
                on_step(step, schedule.total)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    if not written:
        raise DlciError("torch.profiler wrote no trace", hint="report this with the log")
    return ProfileResult(
        trace=trace,
        steps=schedule.active,
        device=str(dev),
        cpu_only=dev.type != "cuda",
        wall_time_s=time.perf_counter() - start,
    )
