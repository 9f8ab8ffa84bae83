"""activations: dead and saturated units, in every activation the forward calls.

The units module sees modules and functional calls alike (nn.ReLU, F.gelu, torch.tanh,
x.sigmoid()) and knows what dead and saturated mean for each kind.
"""

from __future__ import annotations

from typing import Any

from dlci.checks.base import FAIL, PASS, SKIP, WARN, CheckResult, Context, fmt
from dlci.checks.units import MAX_SITES, UNDERSTOOD, Recording, Site, recording
from dlci.training.batching import logits_of

SHOWN = 20  # sites listed in the details, worst first
CLAMPED_SHARE = 0.25  # class scores exactly 0 (none below) from which they are taken as clamped


def activations(ctx: Context) -> CheckResult:
    warn = ctx.policy.threshold("activations", "warn-share")
    fail = ctx.policy.threshold("activations", "fail-share")
    expected = f"under {warn:.0%} dead or saturated units per layer"
    record, outputs = _record(ctx)
    if clamped := _clamped_scores(ctx, outputs):
        return clamped
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


def _record(ctx: Context) -> tuple[Recording, Any]:
    """One forward pass in eval mode, every understood activation call recorded; and the
    outputs."""
    import torch

    ctx.model.eval()
    with torch.no_grad(), recording(ctx.model) as record:
        outputs = ctx.evaluate()  # the target's eval_step, when its forward needs the targets
    return record, outputs


def _clamped_scores(ctx: Context, outputs: Any) -> CheckResult | None:
    """Class scores clamped at zero (a ReLU on the last layer): at least CLAMPED_SHARE of
    them exactly 0, none below, some above. A class whose score is clamped gets no gradient from the
    cross-entropy, so an example whose true class sits there cannot be fitted."""
    import torch

    if not ctx.is_classification():
        return None
    classes = ctx.classes()[0]
    scores = logits_of(outputs, classes=classes)
    if not (isinstance(scores, torch.Tensor) and scores.ndim >= 2 and scores.numel()):
        return None
    if scores.shape[-1] != classes or not scores.is_floating_point():
        return None
    zeros = float((scores == 0).float().mean())
    # every score 0 is a zero-initialised head (ReZero, adaLN-zero), not a clamp: a clamp
    # leaves the scores above zero where they are
    if not CLAMPED_SHARE <= zeros < 1 or float(scores.min()) < 0:
        return None
    return CheckResult(
        "activations",
        WARN,
        f"the class scores the loss reads are clamped at 0: {zeros:.0%} of them exactly 0, "
        "none below",
        "class scores (logits) free to go negative",
        cause="the last layer ends in a ReLU (or another clamp): a class whose score is "
        "clamped gets no gradient, so examples of it stop being fitted (cross-entropy wants "
        "raw logits)",
        fix="remove the activation after the last layer: return the logits as they are",
        details={"zero_share": zeros, "classes": classes},
    )


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
