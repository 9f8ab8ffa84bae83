"""The memorization test's result: the verdict and its reason, complete or partial.

A partial result is what the watchdog (watchdog.py) keeps when a step outlives the time cap,
and what ``dlci memorize`` writes before the target runs, so that a process that ends inside
the target's code leaves a failing report, never a missing one.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class MemorizeResult:
    verdict: str  # "pass" or "fail"
    stopped_by: str  # threshold, epochs, time, nonfinite; watchdog, exited, error (partial)
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
    stuck_at: str | None = None  # watchdog: file:line in function of the stuck thread
    stack: list[str] = field(default_factory=list)  # watchdog: that thread's Python stack

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


def training_time(wall: float, setup: float) -> str:
    """What the verdict's time counts: the training steps, then with dl-ci's set-up before them.

    >>> training_time(3.21, 0.3)
    'in 3.2 s of training (3.5 s with the set-up of batch, model and optimizer)'
    >>> training_time(0.042, 0.0061)
    'in 42 ms of training (48 ms with the set-up of batch, model and optimizer)'
    """
    return (
        f"in {_seconds(wall)} of training "
        f"({_seconds(wall + setup)} with the set-up of batch, model and optimizer)"
    )


def _seconds(value: float) -> str:
    """Seconds to one decimal, or milliseconds under a second (a fast run is not '0.0 s')."""
    return f"{value:.1f} s" if value >= 1 else f"{value * 1000:.0f} ms"


def judge(
    config: Any,
    *,
    losses: list[float],
    best: float | None,
    best_step: int | None,
    stopped_by: str,
    wall: float,
    setup: float,
    device: str,
    dist: Any,
    examples: int,
    changes: list[str],
    hparams: dict[str, Any],
) -> MemorizeResult:
    steps = len(losses)
    final = losses[-1] if losses else None
    threshold = f"{config.max_loss:g}"
    wall, setup = round(wall, 4), round(setup, 4)  # the reason says what the report keeps
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
        wall_time_s=wall,
        setup_time_s=setup,
        device=device,
        world_size=dist.world_size,
        batch_examples=examples,
        changes=changes,
        hparams=hparams,
    )


def partial(*, stopped_by: str, reason: str, losses: list[float], **known: Any) -> MemorizeResult:
    """A failing result for a run that did not reach its own end: ``losses`` so far."""
    finite = [(v, i + 1) for i, v in enumerate(losses) if math.isfinite(v)]
    best, best_step = min(finite) if finite else (None, None)
    values: dict[str, Any] = {
        "wall_time_s": 0.0,
        "setup_time_s": 0.0,
        "device": "",
        "world_size": 1,
        "batch_examples": 0,
    }
    values.update(known)
    return MemorizeResult(
        verdict="fail",
        stopped_by=stopped_by,
        reason=reason,
        steps=len(losses),
        best_loss=best,
        best_step=best_step,
        final_loss=losses[-1] if losses else None,
        losses=list(losses),
        **values,
    )


def stuck_reason(config: Any, step: int, losses: list[float], stuck_at: str) -> str:
    """Why the watchdog stopped the run: the cap, the step (0: before the first), the place.

    >>> stuck_reason(type("C", (), {"time_cap_s": 1.2})(), 3, [2.0, 1.5], "t.py:9 in f")
    'the time cap of 0.02 min passed inside step 3; last loss 1.5 at step 2; stuck at: t.py:9 in f'
    """
    cap = f"the time cap of {config.time_cap_s / 60:g} min passed"
    where = (
        f"inside step {step}"
        if step
        else "before the first step (taking the batch, building the model and optimizer)"
    )
    last = f"; last loss {losses[-1]:.4g} at step {len(losses)}" if losses else ""
    return f"{cap} {where}{last}; stuck at: {stuck_at}"
