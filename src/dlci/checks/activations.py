"""activations: dead and saturated units, in every activation the forward calls.

The units module sees modules and functional calls alike (nn.ReLU, F.gelu, torch.tanh,
x.sigmoid()) and knows what dead and saturated mean for each kind.
"""

from __future__ import annotations

from typing import Any

from dlci.checks.base import FAIL, PASS, SKIP, WARN, CheckResult, Context, fmt
from dlci.checks.units import MAX_SITES, UNDERSTOOD, Recording, Site, recording

SHOWN = 20  # sites listed in the details, worst first


def activations(ctx: Context) -> CheckResult:
    warn = ctx.policy.threshold("activations", "warn-share")
    fail = ctx.policy.threshold("activations", "fail-share")
    expected = f"under {warn:.0%} dead or saturated units per layer"
    record = _record(ctx)
    sites = list(record.sites.values())
    if not sites:
        return _not_seen(ctx.model)
    details = _details(sites, record)
    judged = [s for s in sites if s.alive or s.elements]
    if not judged:  # leaky ReLU and PReLU only
        kinds = ", ".join(sorted({s.kind for s in sites}))
        measured = f"{len(sites)} places, all {kinds}: a slope at every input, no unit can die"
        return CheckResult("activations", PASS, measured, expected, details=details)
    worst = max(judged, key=_score)
    dead, saturated = worst.dead_share(), worst.saturated_share()
    kind = "dead" if worst.alive and dead >= saturated else "saturated"
    share = max(dead, saturated)
    measured = f"{worst.label}: {share:.0%} {kind}"
    # ReLUs fed only positive inputs (after ReLU and pooling) leave a share of units silent
    # on a small batch at initialisation; that is not yet a dead network
    if share < warn:
        measured += f" (the worst of {len(sites)} places)" if len(sites) > 1 else " (one place)"
        return CheckResult("activations", PASS, measured, expected, details=details)
    status = FAIL if share >= fail else WARN
    return _verdict(status, kind, (measured, expected), details)


def _score(site: Site) -> float:
    return max(site.dead_share(), site.saturated_share())


def _record(ctx: Context) -> Recording:
    """One forward pass in eval mode, every understood activation call recorded."""
    import torch

    ctx.model.eval()
    with torch.no_grad(), recording(ctx.model) as record:
        ctx.forward()
    return record


def _not_seen(model: Any) -> CheckResult:
    """Nothing to measure: say why, and what would let the check run."""
    from torch import nn

    fused = sorted({type(m).__name__ for m in model.modules() if isinstance(m, nn.RNNBase)})
    cause = "the forward called no activation dl-ci understands (" + ", ".join(UNDERSTOOD) + ")"
    if fused:
        cause += f"; the gates of {', '.join(fused)} run inside one fused kernel, out of sight"
    return CheckResult(
        "activations",
        SKIP,
        cause=cause,
        fix="nothing to do if the model has no other nonlinearity; one called as a torch "
        "function or module (F.relu, nn.GELU, torch.tanh) in forward is checked",
    )


def _details(sites: list[Site], record: Recording) -> dict[str, Any]:
    shown = sorted(sites, key=_score, reverse=True)[:SHOWN]
    details: dict[str, Any] = {
        s.label: {
            "kind": s.kind,
            "units": s.units,
            "calls": s.calls,
            **({"dead": fmt(s.dead_share())} if s.alive else {}),
            **({"saturated": fmt(s.saturated_share())} if s.elements else {}),
        }
        for s in shown
    }
    if len(sites) > SHOWN or record.skipped_calls:
        details["not_shown"] = {
            "places": max(0, len(sites) - SHOWN),
            "calls_beyond_the_first_places": record.skipped_calls,
            "places_recorded_at_most": MAX_SITES,
        }
    return details


_CAUSES = {
    "dead": "units whose activation is flat for every example pass no gradient and may never "
    "recover",
    "saturated": "saturated units pass almost no gradient",
}
_FIXES = {
    "dead": "check the initialisation (Kaiming for ReLU, biases near 0) and the input scale, "
    "lower the learning rate, or use a leaky activation",
    "saturated": "normalise the inputs, initialise smaller, or add normalization before the "
    "activation",
}


def _verdict(
    status: str, kind: str, texts: tuple[str, str], details: dict[str, Any]
) -> CheckResult:
    """A warning from 40% dead or saturated units in a layer, a failure from 50% (by default:
    the project's thresholds warn-share and fail-share)."""
    measured, expected = texts
    return CheckResult(
        "activations",
        status,
        measured,
        expected,
        cause=_CAUSES[kind],
        fix=_FIXES[kind],
        details=details,
    )
