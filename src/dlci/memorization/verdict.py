"""The memorization test's result: the verdict and its reason, complete or partial.

A partial result is what the watchdog (watchdog.py) keeps when a step outlives the time cap,
and what ``dlci memorize`` writes before the target runs, so that a process that ends inside
the target's code leaves a failing report, never a missing one.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from dlci.ladder.goal import FLOOR_HINT, Goal, percent, smoothed
from dlci.memorization import curve

# what a failed gate's user does next: the doctor, and the checks that usually explain it
DOCTOR = "run dlci doctor --target {target}"
TARGET_SLOT = "<your target>"  # replaced by the run's own target where it is known
NEXT_CHECKS = {
    "flat": "optimizer-coverage, grad-flow, update-ratio and lr-range usually explain a loss "
    "that does not fall (parameters the optimizer never sees, gradients that never reach them, "
    "a learning rate orders of magnitude off)",
    "slow": "lr-range, update-ratio and initial-loss usually explain a loss that falls too "
    "slowly (a learning rate off, updates too small, outputs or loss not what you think)",
    "nonfinite": "initial-loss, loss-broadcast and lr-range usually explain a loss that becomes "
    "NaN or infinite (a loss on the wrong tensors, a learning rate far too high)",
    "unjudged": "the doctor cannot help here: " + FLOOR_HINT,
    "stuck": "a step outlived the time cap: the place it was stuck at says where to look",
    "blind": "the loss fell only as far as a model that ignores its inputs can: check that "
    "the inputs reach the model (not zeros, not detached, not overwritten), that the loss "
    "compares the outputs with the targets, and, for a VAE, that its KL term is not weighted "
    "far above its reconstruction (posterior collapse); batch-independence and "
    "label-alignment look at the same path",
    "still-falling": "the loop learns, more slowly than this tier allows: raise the learning "
    "rate (lr-range shows the steepest), or size the ladder to this model with dlci calibrate "
    "--target {target} (docs/calibration.md)",
    "noisy": "the loss jumps between steps on the same batch and draws: a generator of the "
    "model's own (torch.Generator, np.random.default_rng) draws anew at every step; draw from "
    "the global generators, which the gate replays, or give the target's step a fixed seed",
}


@dataclass
class MemorizeResult:
    verdict: str  # "pass" or "fail"
    stopped_by: str  # threshold, epochs, time, nonfinite, ended (a script's own loop); watchdog,
    # exited, error (partial)
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
    start_loss: float | None = None  # step 1: on the batch, before the first update
    relative_loss: float | None = None  # the best later loss as a share of the start (goal.py)
    criterion: str = ""  # what memorised meant for this run, in words
    loss_floor: float | None = None  # measured or declared (None: assumed 0)
    floor_source: str = "assumed"  # measured (on the batch), declared (by the target), assumed
    blind_loss: float | None = None  # the input-blind baseline (memorization/floor.py)
    measured: list[str] = field(default_factory=list)  # what was measured before step 1
    draws_replayed: bool = False  # every step ran on the same random draws
    judged_on: str = ""  # which value of the curve the verdict reads
    case: str = ""  # memorised, flat, blind, still-falling, noisy, slow, nonfinite, unjudged, ...
    projected_epochs: int | None = None  # still falling: the epoch the goal would be reached
    next_step: str = ""  # a failed run: the command to run next and the checks to read
    stuck_at: str | None = None  # watchdog: file:line in function of the stuck thread
    stack: list[str] = field(default_factory=list)  # watchdog: that thread's Python stack

    @property
    def passed(self) -> bool:
        return self.verdict == "pass"

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["losses"] = [_json_float(v) for v in self.losses]
        for key in ("best_loss", "final_loss", "start_loss", "relative_loss", "blind_loss"):
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


JUDGED_ON = "the median of the last 3 losses after step 1 (goal.smoothed)"


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
    goal: Goal | None = None,
    unjudged: str | None = None,
    before: Any = None,
) -> MemorizeResult:
    goal = goal or Goal(config.max_loss, getattr(config, "max_relative_loss", None))
    steps = len(losses)
    final = losses[-1] if losses else None
    start = losses[0] if losses else None
    wall, setup = round(wall, 4), round(setup, 4)  # the reason says what the report keeps
    judged = [smoothed(losses[: i + 1]) for i in range(len(losses))]
    later = _best_later(judged)  # the best judged loss after the first update, and its step
    rel = goal.relative(start, later[0]) if start is not None and later else None
    met = [i + 1 for i, v in enumerate(judged) if start is not None and goal.met(start, v, i + 1)]
    shape = _shape(goal, start, judged, config)
    verdict, kind, reason = _decide(
        config,
        goal,
        stopped_by=stopped_by,
        losses=losses,
        fell=_fall(start, later, rel, goal),
        rel=rel,
        met=met,
        timing=training_time(wall, setup),
        detail=unjudged or _best_text(best, best_step),
        shape=shape,
        start_share=_start_share(goal, start, later),
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
        start_loss=start,
        relative_loss=rel,
        criterion=goal.describe(),
        loss_floor=goal.floor,
        floor_source=before.references.floor_source if before is not None else "assumed",
        blind_loss=goal.blind,
        measured=list(before.lines) if before is not None else [],
        draws_replayed=before is not None,
        judged_on=JUDGED_ON,
        case=kind or "memorised",
        projected_epochs=shape.projected_step if kind == "still-falling" else None,
        next_step=_with_floor_hint(next_step(kind) if kind else "", kind, before),
    )


def _shape(goal: Goal, start: float | None, judged: list[float], config: Any) -> curve.Shape:
    if start is None or len(judged) < 2:
        return curve.Shape(False, None, False, 0.0)
    relative = [goal.relative(start, v) for v in judged[1:]]
    values = [math.nan if v is None else v for v in relative]
    return curve.read(values, goal.relative_limit, int(getattr(config, "max_epochs", 0) or 0))


def _start_share(goal: Goal, start: float | None, later: tuple[float, int] | None) -> float | None:
    """The best judged loss as a share of the start above the floor (not of the baseline)."""
    if start is None or later is None:
        return None
    floor = goal.floor or 0.0
    if start - floor <= 0:
        return None
    return max(0.0, (later[0] - floor) / (start - floor))


def _decide(
    config: Any,
    goal: Goal,
    *,
    stopped_by: str,
    losses: list[float],
    fell: str,
    rel: float | None,
    met: list[int],
    timing: str,
    detail: str,
    shape: curve.Shape,
    start_share: float | None,
) -> tuple[str, str, str]:
    """The verdict, the kind of failure (for the next step) and the reason in words."""
    steps, final = len(losses), losses[-1] if losses else None
    if stopped_by == "threshold" and final is not None:
        share = f", {percent(rel)} {_of(goal, losses[0])}" if rel is not None else ""
        return (
            "pass",
            "",
            (
                f"loss {losses[0]:.4g} -> {final:.4g} at step {steps}{share} "
                f"(memorised means {goal.describe()}) {timing}"
            ),
        )
    if stopped_by == "nonfinite":
        return (
            "fail",
            "nonfinite",
            f"the loss is {final} at step {steps} ({detail}); stopped at once",
        )
    if stopped_by == "unjudged":
        return "fail", "unjudged", f"cannot judge memorisation: {detail} (at step {steps})"
    if met:  # early stop switched off: the same criterion, judged after all epochs
        return "pass", "", f"{goal.describe()} reached at step {met[0]} of {steps}, {fell} {timing}"
    criterion = f"memorised means {goal.describe()}"
    kind, head = _failure(goal, losses, stopped_by, rel, shape, start_share, config)
    if stopped_by == "time":
        cap = f"time cap of {config.time_cap_s / 60:g} min reached at step {steps} of "
        return "fail", kind, f"{cap}{config.max_epochs}; {head}: {fell}; {criterion}"
    if stopped_by == "plateau":
        return (
            "fail",
            kind,
            (
                f"{head}: {fell}; it came no closer to its floor in the last {curve.PLATEAU_STEPS} "
                f"steps, so more epochs cannot help (stopped at step {steps} of "
                f"{config.max_epochs}); {criterion}"
            ),
        )
    if stopped_by == "flat":
        return (
            "fail",
            kind,
            (
                f"{head}: {fell}; it did not move (by more than {curve.FLAT_TOLERANCE:g} of its "
                f"start) in {steps} steps on the same batch and draws, so more epochs cannot help; "
                f"{criterion}"
            ),
        )
    if stopped_by == "ended":  # the user's own loop (script mode) ended before the tier did
        return (
            "fail",
            kind,
            f"{head}: {fell}; the script ended after {steps} steps, before the tier's "
            f"{config.max_epochs} epochs; {criterion}",
        )
    return "fail", kind, f"{head}: {fell}, in {config.max_epochs} epochs; {criterion}"


def _failure(
    goal: Goal,
    losses: list[float],
    stopped_by: str,
    rel: float | None,
    shape: curve.Shape,
    start_share: float | None,
    config: Any,
) -> tuple[str, str]:
    """The kind of a failed run and its headline."""
    if stopped_by == "flat":
        return "flat", "the loss did not fall from its start"
    if shape.still_falling and stopped_by in ("epochs", "time", "ended"):
        epochs = getattr(config, "max_epochs", 0)
        pace = (
            f"; at its pace it would reach the goal near epoch {shape.projected_step}"
            if shape.projected_step is not None
            else ""
        )
        ended = {
            "time": f"when the time cap stopped it at step {len(losses)}",
            "ended": f"when the script ended at step {len(losses)}",
        }.get(stopped_by, f"when the tier's {epochs} epochs ended")
        return "still-falling", f"the loss was still falling steadily {ended}{pace}"
    start = losses[0] if losses else math.nan
    blind_ref = goal.blind is not None and goal.blind_is_reference(start)
    if blind_ref and (rel is None or rel > 0.9) and start_share is not None and start_share < 0.9:
        return "blind", (
            f"the loss fell from its start, but not below the input-blind baseline "
            f"{goal.blind:.4g} (the best loss of one output shared by every example, measured "
            "on this batch): a model that ignores its inputs falls as far"
        )
    if rel is None or rel > 0.9:
        return "flat", "the loss did not fall from its start"
    if shape.noisy:
        return "noisy", (
            f"the loss fell, but it is noisy on the same batch and draws (steps differ by a "
            f"median {percent(shape.jump)} of its reference)"
        )
    return "slow", "the loss fell, but not far enough, and flattened out above the goal"


def next_step(kind: str, target: str = TARGET_SLOT) -> str:
    """What to do after a failed run of this kind.

    >>> next_step("flat", "pkg.train:make")[:45]
    'run dlci doctor --target pkg.train:make; opti'
    """
    checks = NEXT_CHECKS.get(kind, NEXT_CHECKS["flat"])
    if kind in ("unjudged", "stuck", "noisy"):
        return checks
    if kind == "still-falling":
        return checks.format(target=target)
    return f"{DOCTOR.format(target=target)}; {checks}"


def _best_later(losses: list[float]) -> tuple[float, int] | None:
    """The lowest finite loss after step 1 and its step, or None.

    >>> _best_later([2.0, 1.0, 0.5, 0.7]), _best_later([2.0])
    ((0.5, 3), None)
    """
    later = [(v, i + 2) for i, v in enumerate(losses[1:]) if math.isfinite(v)]
    return min(later) if later else None


def _fall(
    start: float | None,
    later: tuple[float, int] | None,
    rel: float | None,
    goal: Goal | None = None,
) -> str:
    """How far the loss fell from its start, in words.

    >>> _fall(0.7463, (0.7463, 12), 1.0)
    'from 0.7463 at step 1 to at best 0.7463 at step 12 (100% of its start)'
    >>> _fall(0.69, None, None)
    'from 0.69 at step 1, with no step after it'
    """
    if start is None:
        return "no finite loss"
    if later is None:
        return f"from {start:.4g} at step 1, with no step after it"
    share = f" ({percent(rel)} {_of(goal, start)})" if rel is not None else ""
    return f"from {start:.4g} at step 1 to at best {later[0]:.4g} at step {later[1]}{share}"


FLOOR_ASSUMED_HINT = (
    "; the floor was assumed 0 (the loss is not separable from the target's train_step): a "
    "loss that cannot reach 0 on its targets (continuous or soft targets under BCE, label "
    "smoothing, a KL term) flattens above it, so give the target its loss_fn or declare "
    "loss_floor (a number or a function of the batch; docs/target.md)"
)


def _with_floor_hint(text: str, kind: str, before: Any) -> str:
    """A loss that flattened above a floor assumed 0 may have flattened at its real floor."""
    assumed = before is not None and before.references.floor_source == "assumed"
    return text + FLOOR_ASSUMED_HINT if assumed and kind in ("slow", "noisy") and text else text


def _of(goal: Goal | None, start: float) -> str:
    """What a relative loss is a share of: the start, or the input-blind baseline below it."""
    if goal is not None and goal.blind is not None and goal.blind_is_reference(start):
        return "of the input-blind baseline"
    return "of its start"


def _best_text(best: float | None, best_step: int | None) -> str:
    return f"best {best:.4g} at step {best_step}" if best is not None else "no finite loss"


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
