"""What a loss can reach on the gate's own batch: its floor, and the input-blind baseline.

A loss falls only as far as its targets allow. Cross-entropy with label smoothing 0.1 over 10
classes stops at 0.50, soft-target distillation at the teacher's entropy, an InfoNCE loss at
its temperature's bound, a BCE on pixel intensities at the pixels' entropy, a Poisson NLL at
the counts' own term (below 0 for counts above e). None of these is 0, and each depends on
the examples the gate picked. So the floor is measured: the model's outputs on the batch are
set free (a leaf tensor per output, one value per example) and optimised on the target's own
``loss_fn`` against the batch's targets: what a perfect memoriser would reach.

The same optimisation with one output shared by every example (per position for sequences:
only the batch dimension is shared) gives the *input-blind baseline*: the best a model that
ignores its inputs can do (label priors, a mean image, a uniform similarity). A model fed
zeros falls from a uniform start to there; memorised means well below it, not only well
below the start.

Both are found in a fixed number of optimiser steps (never seconds), on the same random draws
at every evaluation, and neither touches the model.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dlci.errors import DlciError
from dlci.training.guard import user_code

ADAM_STEPS = 300  # Adam with a cosine-decayed rate, then L-BFGS from where it ended
LBFGS_STEPS = 30
MAX_VALUES = 2_000_000  # outputs larger than this (a big LM's logits) are not set free:
# each search evaluates the loss about 330 times, twice
MEASURED, DECLARED, ASSUMED = "measured", "declared", "assumed"


@dataclass(frozen=True)
class References:
    """The losses a run is judged against, besides its start, and how each was found."""

    floor: float | None  # None: not known; a loss that stays >= 0 is judged against 0
    floor_source: str  # measured, declared or assumed (0)
    blind: float | None = None  # the input-blind baseline; None: not measured
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def describe(self) -> str:
        """The references in words, as the report states them.

        >>> References(0.5, MEASURED, 2.2).describe()
        'floor 0.5 (measured on the batch), input-blind baseline 2.2'
        >>> References(None, ASSUMED).describe()
        'floor 0 (assumed: the loss is not separable from the step)'
        """
        if self.floor_source == MEASURED:
            text = f"floor {self.floor:.4g} (measured on the batch)"
        elif self.floor_source == DECLARED:
            text = f"floor {self.floor:.4g} (declared by the target)"
        else:
            why = self.notes[0] if self.notes else "the loss is not separable from the step"
            text = f"floor 0 (assumed: {why.removesuffix(': floor assumed 0')})"
        if self.blind is not None:
            text += f", input-blind baseline {self.blind:.4g}"
        return text


def declared(floor: Any, batch: Any) -> float:
    """The target's declared floor: a number, or a function of the batch."""
    if callable(floor):
        with user_code("loss_floor"):
            value = floor(batch)
        try:
            value = float(value)
        except (TypeError, ValueError):
            value = math.nan
        if not math.isfinite(value):
            raise DlciError(
                f"loss_floor(batch) returned {value!r}, not a finite number",
                hint="return the lowest loss this batch's targets allow, as a float",
            )
        return value
    return float(floor)


def measure(
    loss_fn: Callable[[Any, Any], Any],
    outputs: Any,
    targets: Any,
    examples: int,
    replay: Callable[[], None],
) -> References:
    """The floor and the input-blind baseline of ``loss_fn`` on these outputs' shapes and
    these targets; ``replay`` puts the random draws back before every evaluation.

    The search runs on the CPU: free outputs stray where no model's would (probabilities
    past 1), and a loss such as ``BCELoss`` answers that with an exception on the CPU but
    with a device-side assert, which ends the process's CUDA context, on a GPU. A loss that
    holds tensors of its own on the GPU (class weights) is measured where they are."""
    import torch

    began = time.perf_counter()
    leaves, _ = flatten(outputs)
    size = sum(leaf.numel() for leaf in leaves if _settable(leaf))
    if not size:
        note = (
            f"the outputs (a {type(outputs).__name__}) hold no floating tensor dl-ci can set "
            "free: floor assumed 0"
        )
        return References(None, ASSUMED, notes=[note], seconds=time.perf_counter() - began)
    if size > MAX_VALUES:
        note = f"the outputs hold {size:,} values, too many to set free: floor assumed 0"
        return References(None, ASSUMED, notes=[note], seconds=time.perf_counter() - began)
    on_cpu = _to(outputs, torch.device("cpu")), _to(targets, torch.device("cpu"))
    on_device = any(isinstance(t, torch.Tensor) and t.device.type != "cpu" for t in leaves)
    if on_device and not _evaluates(loss_fn, *on_cpu, replay):
        on_cpu = outputs, targets  # the loss keeps device tensors of its own
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a few thousand tiny evaluations: threads only wait for each other
    try:
        floor, blind, notes = _search(loss_fn, *on_cpu, examples, replay)
    finally:
        torch.set_num_threads(threads)
    seconds = time.perf_counter() - began
    if floor is None:
        return References(None, ASSUMED, notes=notes, seconds=seconds)
    return References(floor, MEASURED, blind, notes, seconds)


def _to(tree: Any, device: Any) -> Any:
    import torch

    leaves, rebuild = flatten(tree)
    return rebuild(
        [leaf.detach().to(device) if isinstance(leaf, torch.Tensor) else leaf for leaf in leaves]
    )


def flatten(value: Any, depth: int = 0) -> tuple[list[Any], Callable[[list[Any]], Any]]:
    """The leaves of nested tuples, lists, named tuples, dicts (a Transformers ModelOutput
    too) and dataclasses, and the function that builds the same structure from new leaves.

    >>> import dataclasses, torch
    >>> @dataclasses.dataclass
    ... class Out:
    ...     logits: torch.Tensor
    ...     extra: dict
    >>> leaves, rebuild = flatten(Out(torch.ones(2), {"a": (torch.zeros(1), 3)}))
    >>> len(leaves), rebuild([1, 2, 3]).extra
    (3, {'a': (2, 3)})
    """
    if depth > 32:
        return [value], lambda new: new[0]
    if isinstance(value, dict):
        keys = list(value)
        parts = [flatten(value[key], depth + 1) for key in keys]

        def rebuild_dict(new: list[Any]) -> Any:
            items = dict(zip(keys, _split(parts, new), strict=True))
            try:
                return (
                    type(value)(**items) if dataclasses.is_dataclass(value) else type(value)(items)
                )
            except Exception:  # a mapping type that cannot be built from items: a plain dict
                return items

        return [leaf for leaves, _ in parts for leaf in leaves], rebuild_dict
    if isinstance(value, list | tuple):
        parts = [flatten(item, depth + 1) for item in value]

        def rebuild_sequence(new: list[Any]) -> Any:
            items = _split(parts, new)
            if isinstance(value, tuple) and hasattr(value, "_fields"):
                return type(value)(*items)
            return type(value)(items)

        return [leaf for leaves, _ in parts for leaf in leaves], rebuild_sequence
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        names = [f.name for f in dataclasses.fields(value)]
        parts = [flatten(getattr(value, name), depth + 1) for name in names]

        def rebuild_dataclass(new: list[Any]) -> Any:
            return dataclasses.replace(value, **dict(zip(names, _split(parts, new), strict=True)))

        return [leaf for leaves, _ in parts for leaf in leaves], rebuild_dataclass
    return [value], lambda new: new[0]


def _split(parts: list[tuple[list[Any], Callable[[list[Any]], Any]]], new: list[Any]) -> list[Any]:
    """Each part rebuilt from its share of ``new``."""
    out, at = [], 0
    for leaves, rebuild in parts:
        out.append(rebuild(new[at : at + len(leaves)]))
        at += len(leaves)
    return out


def _evaluates(loss_fn: Callable[[Any, Any], Any], outputs: Any, targets: Any, replay: Any) -> bool:
    import torch

    try:
        with torch.no_grad():
            replay()
            loss_fn(outputs, targets)
    except Exception:
        return False
    return True


def _search(
    loss_fn: Callable[[Any, Any], Any],
    outputs: Any,
    targets: Any,
    examples: int,
    replay: Callable[[], None],
) -> tuple[float | None, float | None, list[str]]:
    import torch

    leaves, rebuild = flatten(outputs)
    free = [i for i, leaf in enumerate(leaves) if _settable(leaf)]
    scale, notes = _scale(targets), []
    kinds = [_kind(leaves[i]) for i in free]
    kinds = [
        _bounded(kind, leaves, i, loss_fn, rebuild, targets, replay)
        for i, kind in zip(free, kinds, strict=True)
    ]
    shaped = [kind for kind in kinds if kind != "free"]
    if shaped:
        notes.append("outputs kept on their model's manifold: " + ", ".join(sorted(set(shaped))))

    def evaluate(values: list[Any]) -> Any:
        filled = list(leaves)
        for index, value, kind in zip(free, values, kinds, strict=True):
            filled[index] = _shape(value, kind)
        replay()
        return loss_fn(rebuild(filled), targets)

    with torch.enable_grad():
        start = [
            _unshape(leaves[i].detach().clone(), kind) for i, kind in zip(free, kinds, strict=True)
        ]
        params = [t.clone().requires_grad_(True) for t in start]
        floor, why = _lowest(evaluate, params, scale, start)
        if why:
            notes.append(f"floor: {why}")
        blind = None
        if examples < 2:
            notes.append("one example: no input-blind baseline")
        elif floor is not None:
            shared, expand = _shared(start, examples)
            blind, why = _lowest(lambda v: evaluate(expand(v)), shared, scale, start)
            if why:
                notes.append(f"input-blind baseline: {why}")
    if floor is not None and blind is not None and blind < floor:
        floor = blind  # both are upper bounds of the same minimum: the lower is the better one
    if floor is not None and blind is not None and blind - floor <= 1e-3 * max(abs(floor), 1e-3):
        notes.append(
            "the input-blind baseline reaches the floor: a model that ignores its inputs can zero "
            "this loss's distance to it (targets that do not depend on the example, or a loss "
            "that does not compare outputs with targets), so the fall from the start is all the "
            "verdict can judge"
        )
    return floor, blind, notes


# Outputs a model normalises (log-softmax, softmax, unit vectors) are searched through the same
# normalisation: a free log-probability above 0 would let CTC or NLL fall below any model's floor.
TOLERANCE = 1e-3


def _kind(tensor: Any) -> str:
    """How the model's own outputs are constrained along their last dimension.

    >>> import torch
    >>> logits = torch.randn(4, 3)
    >>> [_kind(logits), _kind(logits.log_softmax(-1)), _kind(logits.softmax(-1))]
    ['free', 'log-probabilities', 'probabilities']
    >>> _kind(torch.nn.functional.normalize(logits, dim=-1))
    'unit vectors'
    """
    import torch

    if tensor.ndim == 0 or tensor.shape[-1] < 2 or not torch.isfinite(tensor).all():
        return "free"
    values = tensor.detach().double()
    if (values <= TOLERANCE).all() and (values.logsumexp(-1).abs() < TOLERANCE).all():
        return "log-probabilities"
    if (values >= 0).all() and ((values.sum(-1) - 1).abs() < TOLERANCE).all():
        return "probabilities"
    if ((values.norm(dim=-1) - 1).abs() < TOLERANCE).all():
        return "unit vectors"
    return "free"


def _bounded(
    kind: str,
    leaves: list[Any],
    index: int,
    loss_fn: Callable[[Any, Any], Any],
    rebuild: Callable[[list[Any]], Any],
    targets: Any,
    replay: Callable[[], None],
) -> str:
    """``values in [0, 1]`` for outputs in [0, 1] (a sigmoid's) that the loss refuses past 1
    (``BCELoss``): the search then keeps them there instead of stalling at the edge."""
    import torch

    leaf = leaves[index]
    if kind != "free" or float(leaf.min()) < 0 or float(leaf.max()) > 1:
        return kind
    probe = list(leaves)
    probe[index] = leaf.detach().clone().reshape(-1)
    probe[index][0] = 1.5
    probe[index] = probe[index].reshape(leaf.shape)
    try:
        with torch.no_grad():
            replay()
            value = loss_fn(rebuild(probe), targets)
        refused = not math.isfinite(float(value))
    except Exception:  # the loss refuses a value past 1: it takes values in [0, 1]
        refused = True
    return "values in [0, 1]" if refused else kind


def _shape(value: Any, kind: str) -> Any:
    """The free value through the model's normalisation."""
    import torch.nn.functional as F

    if kind == "log-probabilities":
        return F.log_softmax(value, dim=-1)
    if kind == "probabilities":
        return F.softmax(value, dim=-1)
    if kind == "unit vectors":
        return F.normalize(value, dim=-1)
    if kind == "values in [0, 1]":
        return value.sigmoid()
    return value


def _unshape(tensor: Any, kind: str) -> Any:
    """A free value that ``_shape`` maps to ``tensor``."""
    if kind == "probabilities":
        return tensor.clamp_min(1e-12).log()
    if kind == "values in [0, 1]":
        return tensor.clamp(1e-6, 1 - 1e-6).logit()
    return tensor


def _settable(leaf: Any) -> bool:
    import torch

    return isinstance(leaf, torch.Tensor) and leaf.is_floating_point() and leaf.numel() > 0


def _scale(targets: Any) -> float:
    """How far outputs may need to travel: the targets' RMS where they are floats, else 1."""
    import torch

    values = [
        float(leaf.detach().double().pow(2).mean().sqrt())
        for leaf in flatten(targets)[0]
        if isinstance(leaf, torch.Tensor) and leaf.is_floating_point() and leaf.numel()
    ]
    finite = [v for v in values if math.isfinite(v)]
    return max([1.0, *finite])


def _shared(start: list[Any], examples: int) -> tuple[list[Any], Callable[[list[Any]], list[Any]]]:
    """One value per output shared by every example (the batch dimension only), and the
    function that expands them back to the outputs' shapes."""
    import torch

    dims = [_batch_dim(t, examples) for t in start]
    generator = torch.Generator().manual_seed(0)  # off a kink (L1 at the targets' median)
    shared = [
        _jittered(t.mean(dim=d, keepdim=True) if d is not None else t, generator)
        for t, d in zip(start, dims, strict=True)
    ]
    shapes = [t.shape for t in start]

    def expand(values: list[Any]) -> list[Any]:
        return [v.expand(shape) for v, shape in zip(values, shapes, strict=True)]

    return shared, expand


def _jittered(tensor: Any, generator: Any) -> Any:
    import torch

    noise = torch.randn(tensor.shape, generator=generator, dtype=tensor.dtype) * 1e-3
    return (tensor.detach() + noise.to(tensor.device) * max(_rms(tensor), 1e-3)).requires_grad_(
        True
    )


def _batch_dim(tensor: Any, examples: int) -> int | None:
    """The dimension that runs over the examples: the first of that size (time-major
    outputs such as CTC's (T, N, C) have it second)."""
    for dim, size in enumerate(tensor.shape):
        if size == examples:
            return dim
    return None


def _lowest(
    evaluate: Callable[[list[Any]], Any], params: list[Any], scale: float, start: list[Any]
) -> tuple[float | None, str]:
    """The lowest finite loss found from ``params``, and a note when the search was cut ('').

    A step the loss refuses (an exception: probabilities outside [0, 1] for ``BCELoss``; or a
    non-finite value) is undone and the rate halved, so the search closes in on the edge of
    the outputs' domain instead of stopping short of it."""
    import torch

    best, note, refused = math.inf, "", 0
    rates = [0.1 * max(scale, _rms(t)) for t in start]
    groups = [{"params": [p], "lr": r} for p, r in zip(params, rates, strict=True)]
    optimizer = torch.optim.Adam(groups)
    moved, first = False, None
    good = [p.detach().clone() for p in params]
    for step in range(ADAM_STEPS):
        optimizer.zero_grad(set_to_none=True)
        value, failure = _loss(evaluate, params)
        if failure:
            refused += 1
            if step == 0 or refused > MAX_REFUSED:
                note = failure
                break
            with torch.no_grad():
                for param, kept in zip(params, good, strict=True):
                    param.copy_(kept)
            for group in optimizer.param_groups:
                group["lr"] *= 0.5
            continue
        best = min(best, float(value.detach()))
        first = float(value.detach()) if first is None else first
        value.backward()
        moved = moved or any(p.grad is not None and bool(p.grad.abs().sum() > 0) for p in params)
        good = [p.detach().clone() for p in params]
        decay = (
            0.5
            * (1 + math.cos(math.pi * (step + 1) / ADAM_STEPS))
            / max(0.5 * (1 + math.cos(math.pi * step / ADAM_STEPS)), 1e-12)
        )
        optimizer.step()
        for group in optimizer.param_groups:
            group["lr"] *= decay  # a cosine decay, kept with the halvings above
    if refused:
        note = note or f"{refused} steps refused by the loss (the outputs' domain edge)"
    if moved and not note.startswith("stopped"):
        best = min(best, _polish(evaluate, params))
    if not moved:
        return None, note or "the loss has no gradient with respect to the outputs"
    if first is not None and best < first - UNBOUNDED * max(1.0, abs(first), scale):
        return None, f"the loss has no floor in its outputs (it kept falling, to {best:.3g})"
    return (best if math.isfinite(best) else None), note


MAX_REFUSED = 40
# a search that fell this many times the loss's own size below its first value found no floor:
# the loss is unbounded below in its outputs (a raw log-likelihood with a free variance)
UNBOUNDED = 1e4


def _polish(evaluate: Callable[[list[Any]], Any], params: list[Any]) -> float:
    """L-BFGS from where Adam ended (exact on a quadratic, fast on a smooth loss); a
    refused evaluation ends it, keeping the best value seen."""
    import torch

    best = math.inf
    optimizer = torch.optim.LBFGS(params, max_iter=LBFGS_STEPS, line_search_fn="strong_wolfe")

    def closure() -> Any:
        nonlocal best
        optimizer.zero_grad(set_to_none=True)
        value, failure = _loss(evaluate, params)
        if failure:
            raise _Stop(failure)
        best = min(best, float(value.detach()))
        value.backward()
        return value

    with contextlib.suppress(_Stop, RuntimeError):  # a refused evaluation ends the polish
        optimizer.step(closure)  # type: ignore[no-untyped-call]
    return best


class _Stop(Exception):
    pass


def _loss(evaluate: Callable[[list[Any]], Any], params: list[Any]) -> tuple[Any, str]:
    import torch

    try:
        value = evaluate(params)
    except Exception as exc:  # the loss refused outputs a model could not give
        return None, f"stopped where the loss refused the outputs ({type(exc).__name__})"
    if not isinstance(value, torch.Tensor) or value.numel() != 1 or not value.requires_grad:
        return None, "stopped: the loss is not a single differentiable value of the outputs"
    if not math.isfinite(float(value.detach())):
        return None, "stopped where the loss became non-finite"
    return value.reshape(()), ""


def _rms(tensor: Any) -> float:
    value = float(tensor.detach().double().pow(2).mean().sqrt())
    return value if math.isfinite(value) else 1.0
