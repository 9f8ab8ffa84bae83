"""What the memorization test measures before its first step, instead of assuming it.

- That regularisation is really off: two train-mode forward passes on fresh draws must agree
  (dropout of every kind switched off); where they differ, whether replaying the random draws
  makes them agree (a VAE, a diffusion step: random by design, replayed at every step) or not
  (a generator of the model's own: the curve is then judged smoothed, and the report says so).
- The loss's floor and the input-blind baseline on the gate's own batch (floor.py), where the
  loss is separable from the step; a floor the target declares (a number, or a function of
  the batch) is used as declared.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dlci.errors import DlciError
from dlci.memorization.floor import ASSUMED, DECLARED, References, declared, measure
from dlci.training.batching import call_model
from dlci.training.draws import Draws, differs
from dlci.training.guard import user_code
from dlci.training.regularization import no_dropout
from dlci.training.target import Target


@dataclass
class Before:
    """The measurements, and one line for the report on each."""

    references: References
    lines: list[str] = field(default_factory=list)
    still_random: bool = False  # outputs differ even on replayed draws: judge smoothed


def measure_before(target: Target, model: Any, batch: Any, examples: int, draws: Draws) -> Before:
    """Probe the forward and measure the references on ``batch`` (already on its device)."""
    import torch

    forward = _forward(target, model, batch)
    lines: list[str] = []
    outputs, still_random = None, False
    with torch.no_grad(), no_dropout() as caught:
        if forward is None:
            lines.append(
                "dropout off, not confirmed: the target's own train_step has no forward dl-ci "
                "can run alone (give the target an eval_step that calls the model)"
            )
        elif target.train_step is None:
            outputs, line, still_random = _probe(forward, draws)
            lines.append(line)
        else:  # the gate steps through train_step: a forward that fails is not the gate's
            try:
                outputs, line, still_random = _probe(forward, draws)
            except DlciError as exc:
                line = f"dropout off, not confirmed: the model's forward failed ({exc.message})"
            lines.append(line)
    lines += [f"dropout off: {name} called with p > 0, run with p = 0" for name in caught]
    references = _references(target, batch, outputs, examples, draws)
    lines.append(f"judged against: {references.describe()}")
    lines += references.notes
    return Before(references, lines, still_random)


def _forward(target: Target, model: Any, batch: Any) -> Callable[[], Any] | None:
    """The model's forward on the batch in train mode: the standard step's call, or the call
    a target's own eval_step makes, caught at the model's door and replayed in train mode."""
    if target.train_step is None:
        inputs = batch[0]

        def standard() -> Any:
            with user_code("the model"):
                return call_model(model, inputs)

        return standard
    if target.eval_step is None:
        return None
    call = _call_of(model, target.eval_step, batch)
    if call is None:
        return None
    args, kwargs = call

    def own() -> Any:
        with user_code("the model"):
            return model(*args, **kwargs)

    return own


class _Caught(Exception):
    def __init__(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        super().__init__("the model's call, caught")
        self.call = args, kwargs


def _call_of(
    model: Any, eval_step: Callable[[Any, Any], Any], batch: Any
) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
    """The arguments ``eval_step`` calls the model with, caught before its forward runs (its
    eval mode and no_grad are then undone); None when it never calls the model itself, or
    fails before."""

    def hook(_module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        raise _Caught(args, kwargs)

    modes = {module: module.training for module in model.modules()}
    handle = model.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        eval_step(model, batch)
    except _Caught as caught:
        return caught.call
    except KeyboardInterrupt:
        raise
    except BaseException:  # an eval_step that fails is not the gate's failure
        return None
    finally:
        handle.remove()
        for module, training in modes.items():
            module.train(training)
    return None


def _probe(forward: Callable[[], Any], draws: Draws) -> tuple[Any, str, bool]:
    """Two passes on fresh draws, two on the replayed ones: the replayed output, the line,
    and whether the forward still differs on replayed draws."""
    first, second = forward(), forward()
    fresh = differs(first, second)
    draws.replay()
    replayed = forward()
    draws.replay()
    again = differs(replayed, forward())
    draws.replay()
    if fresh == 0.0:
        return (
            replayed,
            ("dropout off, confirmed: two train-mode forward passes on fresh draws agree"),
            False,
        )
    if again == 0.0:
        gap = "in structure" if fresh is None else f"by up to {fresh:.3g}"
        return (
            replayed,
            (
                f"the forward is random by design (two train-mode passes on fresh draws differ "
                f"{gap} with dropout off; replayed, they agree): the same draws are replayed "
                "before every step"
            ),
            False,
        )
    gap = "in structure" if again is None else f"by up to {again:.3g}"
    return (
        replayed,
        (
            f"the forward still differs {gap} between two passes on the same replayed draws (a "
            "generator of its own, or a nondeterministic kernel): the loss is judged on the median "
            "of its last steps, and a curve that stays noisy says so"
        ),
        True,
    )


def _references(
    target: Target, batch: Any, outputs: Any, examples: int, draws: Draws
) -> References:
    """The measured floor and baseline where the loss is separable; the declared floor wins
    over a measured one (the target knows its loss)."""
    measured = None
    if target.train_step is None and target.loss_fn is not None and outputs is not None:
        with user_code("loss_fn"):  # an exit inside it ends the run as the step's would
            measured = measure(target.loss_fn, outputs, batch[1], examples, draws.replay)
        draws.replay()
    if target.loss_floor is not None:
        floor = declared(target.loss_floor, batch)
        blind = measured.blind if measured is not None else None
        notes = measured.notes if measured is not None else []
        if blind is not None and blind <= floor:
            blind = None  # the declared floor is above what the measurement found
        return References(floor, DECLARED, blind, notes, measured.seconds if measured else 0.0)
    if measured is not None:
        return measured
    return References(None, ASSUMED)
