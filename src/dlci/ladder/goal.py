"""What "memorised" means: the loss fell from where it started to nearly its floor.

An absolute threshold alone (``max_loss: 1.0``) says nothing about learning: a binary
classifier starts at ln 2 = 0.69, a regression on targets of scale 0.1 at 0.01, and both
pass it at step 1 without a single useful update. So every verdict is measured against the
loss at step 1, computed on the memorised batch before the first update (the *start*), and
against the loss's *floor*, the lowest loss the batch's targets allow (0 for hard-label
cross-entropy and MSE; 0.50 for cross-entropy with label smoothing 0.1 over 10 classes; below
0 for a Poisson NLL on counts above e). The floor is measured on the batch where the loss is
separable from the step (memorization/floor.py), declared by the target where it is not, and
else assumed 0 for a loss that stays >= 0. Where the *input-blind baseline* (the best loss of
one output shared by every example, also measured) lies below the start, it is the reference
instead: falling from a uniform start to the label priors is not memorisation.

    relative loss = (loss - floor) / (reference - floor),  reference = min(start, blind)

A pass needs, at a step after the first, the relative loss at or below the row's
``max_relative_loss`` (when the row states one), the loss below the row's ``max_loss``
(when it states one), and always the relative loss at or below ``BUILTIN_MAX_RELATIVE``:
a loss that did not at least halve its distance to the floor was not memorised, whatever a
ladder says.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# every pass, at every tier of every ladder, needs the loss to have halved its distance to the
# floor: a 3-class model at 0.997 from a start of 1.107 (relative 0.90) did not memorise
BUILTIN_MAX_RELATIVE = 0.5
FLOOR_HINT = (
    "a loss that can go below 0 (a Gaussian NLL, a log-likelihood) needs its floor: "
    "dlci.Target(..., loss_floor=...), e.g. 0.5 * ln(eps) for torch.nn.GaussianNLLLoss"
)


@dataclass(frozen=True)
class Goal:
    """A tier's criterion: ``max_loss`` and ``max_relative_loss`` (either may be None)."""

    max_loss: float | None
    max_relative_loss: float | None
    floor: float | None = None  # measured or declared; None: 0, for a loss that stays >= 0
    blind: float | None = None  # the input-blind baseline; None: not measured

    def reference(self, start: float) -> float:
        """What the fall is measured from: the start, or the input-blind baseline below it.

        >>> Goal(None, 0.1).reference(2.3), Goal(None, 0.1, 0.0, blind=1.5).reference(2.3)
        (2.3, 1.5)
        """
        floor = 0.0 if self.floor is None else self.floor
        if self.blind is not None and floor < self.blind < start:
            return self.blind
        return start

    def blind_is_reference(self, start: float) -> bool:
        return self.reference(start) != start

    @property
    def relative_limit(self) -> float:
        """The relative loss a pass needs: the row's, never looser than the built-in.

        >>> Goal(1.0, None).relative_limit, Goal(None, 0.05).relative_limit
        (0.5, 0.05)
        """
        if self.max_relative_loss is None:
            return BUILTIN_MAX_RELATIVE
        return min(self.max_relative_loss, BUILTIN_MAX_RELATIVE)

    def describe(self) -> str:
        """The criterion in words, as reports and reasons state it.

        >>> Goal(None, 0.05).describe()
        'loss at or below 5% of its start'
        >>> Goal(1.0, None).describe()
        'loss < 1 and at or below 50% of its start'
        >>> Goal(0.5, 0.1, floor=-6.9).describe()
        'loss < 0.5 and at or below 10% of its start (above the floor -6.9)'
        """
        relative = f"at or below {percent(self.relative_limit)} of its start"
        if self.floor is not None and self.floor != 0:
            relative += f" (above the floor {self.floor:.4g})"
        if self.blind is not None:
            relative += f" and of the input-blind baseline {self.blind:.4g}"
        if self.max_loss is None:
            return f"loss {relative}"
        return f"loss < {self.max_loss:g} and {relative}"

    def relative(self, start: float, value: float) -> float | None:
        """``value``'s distance to the floor as a share of ``start``'s; None: cannot be judged.

        >>> Goal(None, 0.1).relative(2.0, 0.1)
        0.05
        >>> Goal(None, 0.1).relative(0.5, -0.2) is None  # below 0 with no declared floor
        True
        >>> round(Goal(None, 0.1, floor=-1.0).relative(1.0, -0.8), 6)
        0.1
        """
        floor = 0.0 if self.floor is None else self.floor
        if not (math.isfinite(start) and math.isfinite(value)) or start - floor <= 0:
            return None
        if self.floor is None and value < 0:
            return None
        return max(0.0, (value - floor) / (self.reference(start) - floor))

    def unjudged(self, start: float, value: float) -> str | None:
        """Why this loss cannot be judged against its start (None: it can).

        >>> Goal(None, 0.1).unjudged(0.5, -0.2)
        'the loss went below 0 (-0.2) and the target declares no floor'
        >>> Goal(None, 0.1).unjudged(0.0, 0.0)
        'the loss starts at its floor (0), so it cannot fall from its start'
        """
        floor = 0.0 if self.floor is None else self.floor
        if self.floor is None and (value < 0 or start < 0):
            low = value if value < 0 else start
            return f"the loss went below 0 ({low:.4g}) and the target declares no floor"
        if math.isfinite(start) and start - floor <= 0:
            return f"the loss starts at its floor ({floor:g}), so it cannot fall from its start"
        return None

    def met(self, start: float, value: float, step: int) -> bool:
        """Whether the loss at ``step`` (1 is the start, before any update) is memorised.

        >>> goal = Goal(1.0, None)
        >>> goal.met(0.7463, 0.7463, 1)  # the frozen binary classifier of issue 28
        False
        >>> goal.met(0.7463, 0.7, 40)  # below 1, but it barely moved
        False
        >>> goal.met(2.3, 0.02, 40)
        True
        """
        if step < 2:
            return False
        rel = self.relative(start, value)
        if rel is None or rel > self.relative_limit:
            return False
        return self.max_loss is None or value < self.max_loss


def percent(share: float) -> str:
    """
    >>> percent(0.05), percent(0.5), percent(0.001), percent(0.025)
    ('5%', '50%', '0.1%', '2.5%')
    """
    return f"{share * 100:.3g}%"


SMOOTHING = 3  # a loss is judged on the median of its last 3 steps after the start


def smoothed(losses: list[float]) -> float:
    """The loss a step is judged on: the median of the last SMOOTHING losses after step 1
    (one lucky draw between two high neighbours is not memorisation).

    >>> smoothed([2.0, 0.1]), smoothed([2.0, 1.0, 0.1, 1.2]), smoothed([2.0, 1.0, 0.5])
    (0.1, 1.0, 0.75)
    """
    tail = sorted(losses[1:][-SMOOTHING:])
    if not tail:
        return losses[0] if losses else math.nan
    middle = len(tail) // 2
    return tail[middle] if len(tail) % 2 else (tail[middle - 1] + tail[middle]) / 2
