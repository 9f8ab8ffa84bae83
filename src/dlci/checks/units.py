"""What the activations check sees: every activation function the forward calls, as a module
(nn.ReLU) or a function (F.gelu, torch.tanh, x.sigmoid()), caught by a torch function mode,
with the right notion of a dead or a saturated unit for each.

A unit is dead when the activation's slope is (almost) zero for every example of the batch:
its weights then get no gradient. A saturated element sits on a flat part of a squashing
function. The input (the pre-activation) decides both, so in-place calls are measured before
they overwrite it. The slope at each threshold is in docs/doctor.md.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

MAX_EXAMPLES = 64  # examples inspected per call
MAX_ELEMENTS = 1 << 20  # elements inspected per call (positions sampled with a stride)
MAX_SITES = 64  # places in the model recorded; further ones are counted, not inspected
MIN_UNITS = 4  # a site with fewer units is recorded but not judged dead

# name -> (dead below this pre-activation (None: cannot die), saturated outside +-this)
# where the slope is under about 1.25% of a linear unit's; the table in docs/doctor.md
_RULES: dict[str, tuple[float | None, float | None]] = {
    "relu": (0.0, None),  # slope 0 at or below 0
    "gelu": (-3.0, None),  # |slope| <= 0.012 below -3
    "silu": (-6.0, None),  # |slope| <= 0.0125 below -6
    "mish": (-6.0, None),  # |slope| <= 0.0125 below -6
    "hardswish": (-3.0, None),  # slope 0 at or below -3
    "elu": (-5.0, None),  # slope alpha * e^x <= 0.0067 alpha below -5
    "celu": (-5.0, None),
    "selu": (-5.0, None),  # slope 1.76 e^x <= 0.012 below -5
    "softplus": (-5.0, None),  # slope sigmoid(beta x) <= 0.0067 below beta x = -5
    "tanh": (None, 2.65),  # |tanh| > 0.99, slope < 0.02
    "sigmoid": (None, 4.6),  # outside 0.01..0.99, slope < 0.01
    "hardsigmoid": (None, 3.0),  # slope 0 outside -3..3
    "hardtanh": (None, None),  # bounds from its arguments; nn.ReLU6 is hardtanh(0, 6)
    "relu6": (0.0, None),  # dead at or below 0; saturated from 6 (see _bounds)
    "leaky_relu": (None, None),  # a slope at every input: cannot die, never saturates
    "prelu": (None, None),
    "rrelu": (None, None),
}
UNDERSTOOD = tuple(_RULES)


def canonical(func: Any) -> str | None:
    """``F.relu``, ``torch.relu_``, ``Tensor.relu`` -> ``relu``; None for other functions."""
    name = getattr(func, "__name__", "")
    name = name.rstrip("_") if name.endswith("_") and not name.startswith("_") else name
    return name if name in _RULES else None


@dataclass
class Site:
    """One place in the model where an activation runs; calls at that place are merged."""

    label: str
    kind: str
    units: int = 0
    alive: list[Any] = field(default_factory=list)  # per reading of the unit axis
    saturated: float = 0.0
    elements: int = 0
    calls: int = 0

    def dead_share(self) -> float:
        readings = [a for a in self.alive if a.numel() >= MIN_UNITS]
        return max((1.0 - float(a.float().mean()) for a in readings), default=0.0)

    def saturated_share(self) -> float:
        return self.saturated / self.elements if self.elements else 0.0


def _bounds(kind: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Any]:
    """(dead-below, saturated outside (low, high)) for this call, from its arguments."""
    dead, sat = _RULES[kind]

    def arg(index: int, name: str, default: float) -> float:
        value = kwargs.get(name, args[index] if len(args) > index else default)
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        return float(value) if ok else default

    if kind == "hardtanh":  # ReLU6 is hardtanh(0, 6): dead at or below 0, saturated from 6
        low, high = arg(1, "min_val", -1.0), arg(2, "max_val", 1.0)
        return (low if low >= 0 else None), (None if low >= 0 else low, high)
    if kind == "relu6":
        return 0.0, (None, 6.0)
    if kind == "softplus":
        beta = arg(1, "beta", 1.0)
        return (dead / beta if dead is not None and beta > 0 else None), None
    return dead, (None if sat is None else (-sat, sat))


def _sample(x: Any) -> Any:
    """At most MAX_EXAMPLES examples and about MAX_ELEMENTS elements of ``x``."""
    x = x.detach()[:MAX_EXAMPLES] if x.ndim else x.detach().reshape(1)
    if x.numel() > MAX_ELEMENTS and x.ndim >= 3:
        flat = x.reshape(x.shape[0], x.shape[1], -1)
        stride = math.ceil(flat.numel() / MAX_ELEMENTS)
        x = flat[:, :, ::stride]
    per_example = max(1, x[0].numel()) if x.ndim else 1
    if x.numel() > MAX_ELEMENTS:  # very wide examples: fewer of them
        x = x[: max(1, MAX_ELEMENTS // per_example)]
    return x.float()


def _unit_axes(ndim: int) -> tuple[int, ...]:
    """The axes a unit may lie on: features of (N, D); channels of (N, C, ...); for (N, L, D)
    and (N, C, L) alike both axis 1 and the last (the reading with more dead units counts:
    the other one is almost never dead in a healthy layer)."""
    if ndim <= 1:
        return ()
    if ndim == 3:
        return (1, 2)
    return (1,)


def measure(site: Site, x: Any, kind: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Add one call's pre-activation ``x`` to ``site``."""
    dead, sat = _bounds(kind, args, kwargs)
    axes = _unit_axes(x.ndim)  # before sampling, which may flatten the positions
    x = _sample(x)
    site.calls += 1
    if sat is not None:
        low, high = sat
        flat = x >= high
        if low is not None:
            flat = flat | (x <= low)
        site.saturated += float(flat.sum())
        site.elements += x.numel()
    if dead is None:
        return
    above = x > dead
    alive = (
        [above.reshape(1, -1).any(dim=1)]
        if not axes
        else [above.movedim(a, 0).reshape(x.shape[a], -1).any(dim=1) for a in axes]
    )
    if site.alive and [a.shape for a in site.alive] == [a.shape for a in alive]:
        site.alive = [old | new for old, new in zip(site.alive, alive, strict=True)]
    else:
        site.alive = alive
    site.units = max(int(a.numel()) for a in alive)


@dataclass
class Frame:
    """A module's forward in progress: its name and the understood calls it made so far."""

    name: str
    calls: int = 0


@dataclass
class Recording:
    sites: dict[tuple[Any, ...], Site] = field(default_factory=dict)
    skipped_calls: int = 0  # calls at places beyond MAX_SITES


@contextmanager
def recording(model: Any) -> Iterator[Recording]:
    """Record every understood activation call made during the block, named by the module
    whose forward made it."""
    from torch.nn.modules import activation
    from torch.overrides import TorchFunctionMode

    record = Recording()
    stack: list[Frame] = []
    kinds = {name: type(m).__name__ for name, m in model.named_modules()}
    own = {name for name, m in model.named_modules() if type(m).__module__ == activation.__name__}

    class Watch(TorchFunctionMode):
        def __torch_function__(
            self, func: Any, types: Any, args: Any = (), kwargs: Any = None
        ) -> Any:
            kwargs = kwargs or {}
            kind = canonical(func)
            if kind is not None and args and _is_float_tensor(args[0]):
                _note(record, stack, own, kinds, kind, args, kwargs)
            return func(*args, **kwargs)

    handles = _push_pop_hooks(model, stack)
    try:
        with Watch():
            yield record
    finally:
        for handle in handles:
            handle.remove()


def _is_float_tensor(value: Any) -> bool:
    import torch

    return isinstance(value, torch.Tensor) and value.is_floating_point()


def _push_pop_hooks(model: Any, stack: list[Frame]) -> list[Any]:
    """Each module's forward pushes a frame, and pops it when it returns."""

    def push(name: str) -> Callable[..., None]:
        return lambda module, inputs: stack.append(Frame(name))

    def pop(module: Any, inputs: Any, output: Any) -> None:
        if stack:
            stack.pop()

    handles = []
    for name, module in model.named_modules():
        try:
            handles.append(module.register_forward_pre_hook(push(name)))
            handles.append(module.register_forward_hook(pop))
        except RuntimeError:  # a TorchScript module takes no hooks: its caller's name stays
            continue
    return handles


def _note(
    record: Recording,
    stack: list[Frame],
    own: set[str],
    kinds: dict[str, str],
    kind: str,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> None:
    frame = stack[-1] if stack else Frame("")
    path, order = frame.name, frame.calls
    frame.calls += 1  # the n-th call in this forward; a cell module called per time step
    # repeats its keys, so its calls merge
    x = args[0]
    key = (path, order, kind, tuple(x.shape[1:]))
    site = record.sites.get(key)
    if site is None:
        if len(record.sites) >= MAX_SITES:
            record.skipped_calls += 1
            return
        # an activation module goes by its own name; a function by its caller's and its own
        label = path if path in own else f"{path or kinds.get('', 'model')} {kind}()"
        taken = sum(1 for s in record.sites.values() if s.label.split(" #")[0] == label)
        site = Site(label + (f" #{taken + 1}" if taken else ""), kind)
        record.sites[key] = site
    measure(site, x, kind, args, kwargs)
