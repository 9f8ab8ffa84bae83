"""The same input means the same random draws: one random state, saved once, replayed.

A model whose forward or step draws random numbers (a VAE's reparameterisation, a diffusion
step's noise and timestep, a masked LM's re-drawn mask) gives a different loss on the same
batch at every call. A gate that compares two calls, or judges a curve of them, would read
those draws as learning or as a leak. ``Draws`` saves the state of every generator a model
commonly draws from (Python's ``random``, NumPy's global generator, torch's CPU generator and
every initialised CUDA device's) and puts it back before each call, so every call sees the
very same draws. A generator the code owns itself (``torch.Generator()``,
``np.random.default_rng()``) is not replayed: ``differs`` is the same-input-twice control that
finds what still varies.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Draws:
    """The saved state of the global random generators; ``replay()`` restores all of them."""

    python: Any
    numpy: Any
    torch_cpu: Any
    cuda: tuple[Any, ...]

    @classmethod
    def capture(cls) -> Draws:
        """The generators' state now.

        >>> import torch
        >>> draws = Draws.capture()
        >>> first = torch.rand(2)
        >>> draws.replay()
        >>> bool((torch.rand(2) == first).all())
        True
        """
        import torch

        return cls(
            python=random.getstate(),
            numpy=_numpy_state(),
            torch_cpu=torch.get_rng_state(),
            cuda=_cuda_states(),
        )

    def replay(self) -> None:
        """Put every generator back where ``capture`` found it."""
        import torch

        random.setstate(self.python)
        if self.numpy is not None:
            import numpy as np

            np.random.set_state(self.numpy)
        torch.set_rng_state(self.torch_cpu)
        if self.cuda:
            torch.cuda.set_rng_state_all(list(self.cuda))

    @contextmanager
    def replayed(self) -> Iterator[None]:
        """Run the block on the saved draws; the generators then go on from where the block
        left them (a replayed run is the same run, not a detour)."""
        self.replay()
        yield


def _numpy_state() -> Any:
    try:
        import numpy as np
    except ImportError:  # pragma: no cover - numpy is a dependency
        return None
    return np.random.get_state()


def _cuda_states() -> tuple[Any, ...]:
    import torch

    if not torch.cuda.is_available() or not torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        return ()
    return tuple(torch.cuda.get_rng_state_all())


def differs(first: Any, second: Any) -> float | None:
    """The largest absolute difference between two outputs of the same structure (0.0: the
    same), or None when they cannot be compared (another structure, shape or type).

    >>> import torch
    >>> differs((torch.ones(2), {"a": torch.zeros(1)}), (torch.ones(2), {"a": torch.ones(1)}))
    1.0
    >>> differs(torch.ones(2), torch.ones(3)) is None
    True
    >>> class Cache:  # an object of its own: the tensors it holds
    ...     def __init__(self, value): self.keys = [torch.full((2,), value)]
    >>> out = {"logits": torch.ones(1), "cache": Cache(1.0)}
    >>> differs(out, {"logits": torch.ones(1), "cache": Cache(1.0)})
    0.0
    """
    import torch

    if isinstance(first, torch.Tensor) and isinstance(second, torch.Tensor):
        if first.shape != second.shape:
            return None
        if first.numel() == 0:
            return 0.0
        a, b = first.detach().double(), second.detach().double()
        both_nan = torch.isnan(a) & torch.isnan(b)
        gap = (a - b).abs().masked_fill(both_nan, 0.0)
        gap = gap.masked_fill(torch.isnan(gap), float("inf"))  # NaN against a number differs
        return float(gap.max())
    return _differs(first, second, 0)


def _differs(first: Any, second: Any, depth: int) -> float | None:
    import torch

    if isinstance(first, torch.Tensor) or isinstance(second, torch.Tensor):
        return None  # a tensor against something else (both tensors are compared above)
    if isinstance(first, int | float | bool | str | bytes | type(None)):
        if type(first) is not type(second):
            return None
        if isinstance(first, float) and isinstance(second, float):
            return abs(first - second) if first == first and second == second else 0.0
        return 0.0 if first == second else math.inf
    left, right = _children(first), _children(second)
    if left is None or right is None:
        if type(first) is not type(second):
            return None
        # an object of its own (a Transformers cache): the tensors it holds, else nothing to
        # compare (0.0: it is no evidence of randomness)
        inner = (getattr(first, "__dict__", None), getattr(second, "__dict__", None))
        if depth >= 6 or not isinstance(inner[0], dict) or not isinstance(inner[1], dict):
            return 0.0
        return _differs(inner[0], inner[1], depth + 1)
    if len(left) != len(right):
        return None
    gaps = [
        differs(a, b) if isinstance(a, torch.Tensor) else _differs(a, b, depth + 1)
        for a, b in zip(left, right, strict=True)
    ]
    if any(g is None for g in gaps):
        return None
    return max((g for g in gaps if g is not None), default=0.0)


def _children(value: Any) -> list[Any] | None:
    if isinstance(value, dict):
        return [value[k] for k in sorted(value, key=str)]
    if isinstance(value, list | tuple):
        return list(value)
    fields = getattr(value, "__dataclass_fields__", None)
    if fields is not None:
        return [getattr(value, name, None) for name in fields]
    return None


def same_twice(call: Callable[[], Any], draws: Draws | None = None) -> tuple[Any, float | None]:
    """Call ``call`` twice on the same draws; its first output and how far the second differs
    (0.0: the same; None: not comparable). The control every comparison of two evaluations
    needs: what differs here differs for a reason that is not the comparison's."""
    draws = draws or Draws.capture()
    draws.replay()
    first = call()
    draws.replay()
    second = call()
    return first, differs(first, second)
