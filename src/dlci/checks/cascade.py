"""Cause and effect across the ladder: which faults can make a later check fail or warn.

Each rung rules out a class of fault, so a check that trains the model (weight-norms,
update-ratio, memorize, lr-range, label-alignment) fails for any fault of the training loop
found before it. Such a failure is no second, independent finding: it "may follow from" the
earlier one, and the report names the root first. The table is read after the whole ladder
ran, so a root that runs later (loss-broadcast, behind the initial loss it distorts) counts.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

FAIL, WARN = "fail", "warn"

# the training loop's faults: each leaves the loop unable to learn as it should
_LOOP = (
    "optimizer-coverage",
    "initial-loss",
    "loss-broadcast",
    "zero-grad",
    "grad-flow",
    "input-normalization",
)
_TRAINS = (*_LOOP, "activations", "weight-norms", "update-ratio")

# check -> the checks whose failure may explain its own failure or warning
CAUSES: dict[str, tuple[str, ...]] = {
    "initial-loss": ("loss-broadcast",),
    "batch-independence": ("train-eval-mode",),
    "activations": ("input-normalization",),
    "weight-norms": _LOOP,
    "update-ratio": (*_LOOP, "weight-norms"),
    # a learning rate far off (lr-range, which runs later) is why memorize fails, not the
    # other way round: lr-range sweeps its own rates, whatever memorize found
    "memorize": (*_TRAINS, "train-eval-mode", "lr-range"),
    "lr-range": (*_TRAINS, "train-eval-mode", "shuffle"),
    # a loop fault can leave the outputs blind; a model that ignores its inputs learns as
    # little from true labels as from shuffled ones (label-alignment below)
    "input-dependence": (*_LOOP, "memorize"),
    "label-alignment": (
        *_TRAINS,
        "train-eval-mode",
        "shuffle",
        "batch-independence",
        "causality",
        "memorize",
        "input-dependence",
        "lr-range",
    ),  # a model that reads its labels (causality), or mixes the examples of a batch
    # (batch-independence), fits shuffled labels as well as true ones
    "leakage": ("causality",),
}


def measured(result: Any) -> bool:
    """Whether a failure is a measured fault, not the target's code raising or exiting inside
    the check (each check that ran that code says so itself: one error, not a cascade)."""
    details = result.details or {}
    return not (
        "frames" in details
        or "location" in details
        or result.measured == "the process was asked to exit"
    )


def roots_of(check: str, status: dict[str, str], seen: frozenset[str] = frozenset()) -> list[str]:
    """The failed checks at the bottom of ``check``'s causes (a cause that itself follows
    from another gives way to that one), in ladder order of the table."""
    found: list[str] = []
    for cause in CAUSES.get(check, ()):
        if status.get(cause) != FAIL or cause in seen:
            continue
        deeper = roots_of(cause, status, seen | {check})
        for root in deeper or [cause]:
            if root not in found:
                found.append(root)
    return found


def attribute(results: Iterable[Any]) -> None:
    """Mark each failed or warning result whose causes failed: ``follows`` names the roots,
    the cause says "may follow from ROOT" first, and the fix says to fix the root first."""
    results = list(results)
    status = {r.id: r.status if measured(r) else "raised" for r in results}
    for result in results:
        if result.status not in (FAIL, WARN) or not measured(result):
            continue
        roots = roots_of(result.id, status)
        if not roots:
            continue
        named = ", ".join(roots)
        result.follows = roots
        result.cause = f"may follow from {named}, which also failed: {result.cause}"
        result.fix = f"fix {named} first, then run the doctor again" + (
            f"; if this check still fails: {result.fix}" if result.fix else ""
        )
