"""leakage: a score too good to be true, and where it comes from: held-out examples copied from
training, one input feature that predicts the label alone, or a near-perfect held-out score
after almost no training."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dlci.checks import overlap, probe
from dlci.checks.base import FAIL, PASS, SKIP, WARN, CheckResult, Context, number
from dlci.checks.labels import (
    LEAKAGE_STEPS,
    evaluate,
    train_batches,
    trained_copy,
    val_batches,
)
from dlci.checks.sample import Sample, Split, data_sample, feature_name
from dlci.training.batching import tree_map

MIN_HELD_OUT = 32  # examples the one-feature probe needs


@dataclass
class Part:
    status: str
    measured: str
    expected: str = ""
    cause: str = ""
    fix: str = ""
    details: dict[str, Any] = field(default_factory=dict)


def leakage(ctx: Context) -> CheckResult:
    if ctx.target.val_loader is None:
        return CheckResult("leakage", SKIP, cause="no val_loader: held-out data is needed")
    sample = data_sample(ctx)
    parts = {
        "copies": _copies(ctx, sample),
        "probe": _single_feature(ctx, sample),
        "group": _feature_group(ctx, sample),
        "early": _early(ctx),
    }
    ran = [p for p in parts.values() if p.status != SKIP]
    if not ran:
        return CheckResult("leakage", SKIP, cause="; ".join(p.measured for p in parts.values()))
    rank = {FAIL: 0, WARN: 1, PASS: 2, SKIP: 3}
    ordered = sorted(parts.values(), key=lambda p: rank[p.status])
    worst = ordered[0]
    return CheckResult(
        "leakage",
        worst.status,
        "; ".join(p.measured for p in ordered),
        "; ".join(p.expected for p in ordered if p.expected),
        cause=worst.cause if worst.status != PASS else "",
        fix=worst.fix if worst.status != PASS else "",
        details={key: dict(p.details, status=p.status) for key, p in parts.items()},
    )


def _flat(sample: Sample) -> tuple[Split, Split, Any, Any] | str:
    """Both splits as (N, F) columns, or why not."""
    train, val = sample.train, sample.val
    if train is None:
        return sample.skip
    if val is None:
        return sample.val_skip
    t, v = train.flat().nan_to_num(), val.flat().nan_to_num()
    if t.shape[1] != v.shape[1]:
        return f"held-out examples have {v.shape[1]} values, training ones {t.shape[1]}"
    return train, val, t, v


def _copies(ctx: Context, sample: Sample) -> Part:
    flat = _flat(sample)
    if isinstance(flat, str):
        return Part(SKIP, f"no search for copies: {flat}")
    train, val, t, v = flat
    found = overlap.find(t, v, ctx.policy.threshold("leakage", "near-copy"))
    expected = "no held-out example copied from training"
    compared = f"{val.coverage()} held-out against {train.coverage()} training examples"
    details = {
        "pairs": [[val.indices[r], train.indices[c], exact] for r, c, exact in found.pairs[:50]],
        "held_out_share": found.cross,
        "training_repeat_share": found.within,
        "indices": {"held_out": val.where(), "training": train.where()},
    }
    if not found.pairs:
        return Part(PASS, f"no held-out example copies a training one ({compared})", expected)
    exact = sum(e for _, _, e in found.pairs)
    named = ", ".join(
        f"held-out {val.indices[r]} = training {train.indices[c]}" + ("" if e else " (near)")
        for r, c, e in found.pairs[:5]
    )
    measured = (
        f"{len(found.pairs)} of {found.val_rows} held-out examples copy training ones "
        f"({exact} exact): {named} ({val.where()}; {compared}; training examples repeat "
        f"among themselves at {found.within:.1%})"
    )
    warn, fail = (ctx.policy.threshold("leakage", k) for k in ("warn-copies", "fail-copies"))
    return Part(
        found.status(warn, fail),
        measured,
        expected,
        cause="held-out examples also appear in training (duplicates split apart, or "
        "augmented and oversampled copies): the held-out score measures memory",
        fix="deduplicate before splitting, split before augmenting or oversampling, and split "
        "by group (patient, source file) where examples come in groups",
        details=details,
    )


def _single_feature(ctx: Context, sample: Sample) -> Part:
    flat = _flat(sample)
    if isinstance(flat, str):
        return Part(SKIP, f"no one-feature probe: {flat}")
    train, val, t, v = flat
    if t.shape[1] > probe.MAX_FEATURES:
        return Part(SKIP, f"no one-feature probe: {t.shape[1]} values per example")
    if val.size < MIN_HELD_OUT:
        return Part(SKIP, f"no one-feature probe: {val.size} held-out examples")
    yt, yv = train.targets, val.targets
    found = _probe(ctx, t, yt, v, yv)
    if found is None:
        return Part(
            SKIP,
            "no one-feature probe: the targets are neither class labels (with num_classes) nor "
            "one number per example",
        )
    name = feature_name(train, found.column)
    warn = number(found.bounds(ctx.policy)[0])
    if found.classification:
        measured = (
            f"{name} alone predicts {found.accuracy:.0%} of held-out labels (chance "
            f"{found.chance:.0%}, skill {found.score:.2f})"
        )
        expected = f"no single feature with skill {warn} or more"
    else:
        measured = f"{name} alone explains R^2 {found.score:.3f} of the held-out targets"
        expected = f"no single feature with R^2 {warn} or more"
    return Part(
        found.status(ctx.policy),
        measured,
        expected,
        cause="one input feature predicts the label nearly alone: a feature derived from the "
        "target (an ID or timestamp ordered by label, a measurement taken after the outcome)",
        fix=f"look at {name}: how it is computed and whether it is known at prediction time; "
        "drop it if it comes from the label",
        details={"feature": name, "score": found.score, "accuracy": found.accuracy},
    )


GROUP_MARGIN = 0.1  # the group must beat the best single feature by this much to count


def _feature_group(ctx: Context, sample: Sample) -> Part:
    """Features that each single out one class and together predict the label (a one-hot
    copy of the label among the inputs): the one-feature probe sees one class of it."""
    flat = _flat(sample)
    if isinstance(flat, str):
        return Part(SKIP, f"no feature-group probe: {flat}")
    train, val, t, v = flat
    yt, yv = train.targets, val.targets
    if t.shape[1] > probe.MAX_FEATURES or val.size < MIN_HELD_OUT:
        return Part(SKIP, "no feature-group probe: see the one-feature probe")
    if not (
        ctx.is_classification()
        and yt is not None
        and yv is not None
        and yt.ndim == 1
        and yv.ndim == 1
        and min(int(yt.min()), int(yv.min())) >= 0
    ):
        return Part(SKIP, "no feature-group probe: the targets are not class labels")
    classes = max(int(ctx.classes()[0] or 0), int(yt.max()) + 1, int(yv.max()) + 1)
    found = probe.group(t, yt, v, yv, classes)
    if found is None:
        return Part(PASS, "no group of one-class features")
    single = _classified(ctx, t, yt, v, yv, classes).score
    names = [feature_name(train, c) for c in found.columns]
    warn, fail = (
        ctx.policy.threshold("leakage", k) for k in ("warn-group-skill", "fail-group-skill")
    )
    adds = found.score - single >= GROUP_MARGIN
    status = (
        FAIL if adds and found.score >= fail else WARN if adds and found.score >= warn else PASS
    )
    listed = ", ".join(names[:6]) + (f" and {len(names) - 6} more" if len(names) > 6 else "")
    measured = (
        f"{len(names)} features ({listed}), each singling out one class, together predict "
        f"{found.accuracy:.0%} of held-out labels (skill {found.score:.2f}; the best one alone "
        f"{single:.2f})"
    )
    return Part(
        status,
        measured,
        f"no group of one-class features with skill {number(warn)} or more",
        cause="the label is spread over several input features, each marking one class (a "
        "one-hot copy of the label, or indicator columns computed from it)",
        fix=f"look at {listed}: how they are computed; drop them if they come from the label",
        details={
            "features": names,
            "classes": found.classes,
            "score": found.score,
            "accuracy": found.accuracy,
            "single_feature_score": single,
        },
    )


def _classified(ctx: Context, t: Any, yt: Any, v: Any, yv: Any, classes: int) -> probe.Probe:
    """The one-feature probe of the class labels, once per doctor run (the group probe
    compares itself with it)."""
    return ctx.memo("one-feature-probe", lambda: probe.classify(t, yt, v, yv, classes))  # type: ignore[no-any-return]


def _probe(ctx: Context, t: Any, yt: Any, v: Any, yv: Any) -> probe.Probe | None:
    if yt is None or yv is None:
        return None
    if ctx.is_classification() and yt.ndim == 1 and yv.ndim == 1 and not yt.is_floating_point():
        classes = max(int(ctx.classes()[0] or 0), int(yt.max()) + 1, int(yv.max()) + 1)
        if min(int(yt.min()), int(yv.min())) < 0:
            return None
        return _classified(ctx, t, yt, v, yv, classes)
    one = yt.ndim == 1 or (yt.ndim == 2 and yt.shape[1] == 1)
    if yt.is_floating_point() and one and yt.numel() == t.shape[0]:
        return probe.regress(t, yt.flatten().float(), v, yv.flatten().float())
    return None


def _targets_are_inputs(batch: Any) -> bool:
    """Whether the batch's targets are one of its input tensors, value for value."""
    import torch

    inputs, targets = batch
    if not isinstance(targets, torch.Tensor):
        return False
    same: list[bool] = []
    tree_map(
        lambda t: same.append(
            isinstance(t, torch.Tensor)
            and t.shape == targets.shape
            and bool(torch.equal(t, targets))
        ),
        inputs,
    )
    return any(same)


def _early(ctx: Context) -> Part:
    """A near-perfect held-out score after 20 steps (label-alignment's copy, when it ran):
    accuracy for classification; else the fit of the outputs, R^2 where they predict the
    targets and AUC where they score 0/1 labels. A loss alone cannot say what perfect is (a
    likelihood has no floor), so other outputs are not judged."""
    if ctx.target.loss_fn is None:
        return Part(SKIP, "no early score: no loss_fn to score held-out data with")
    val = val_batches(ctx)
    if not val:
        return Part(SKIP, "no early score: the val_loader gave no batches")
    if _targets_are_inputs(val[0]):
        return Part(
            SKIP,
            "no early score: the targets are the inputs (an autoencoder's, a denoiser's): a "
            "near-perfect fit soon is the task, not a leak; the one-feature and copy probes "
            "still judge the data",
        )
    score = ctx.shared.get("early-score")
    if score is None:
        score = evaluate(ctx, trained_copy(ctx, train_batches(ctx, LEAKAGE_STEPS))[0], val)
    after = f"after {LEAKAGE_STEPS} steps"
    perfect = ctx.policy.threshold("leakage", "early-score")
    details = {"loss": score.loss, "accuracy": score.accuracy, "steps": LEAKAGE_STEPS}
    if score.accuracy is not None:
        classes = ctx.target.num_classes or 2
        measured = f"held-out accuracy {score.accuracy:.1%} {after}"
        expected = f"well below {perfect:.0%} this early"
        suspicious = score.accuracy >= perfect and classes >= 2
    elif score.fit is not None:
        measured = f"held-out {score.fit_name} {score.fit:.3f} {after}"
        expected = f"{score.fit_name} well below {number(perfect)} this early"
        suspicious = score.fit >= perfect
        details.update(fit=score.fit, fit_name=score.fit_name)
    else:
        reason = score.no_fit or "no accuracy and no fit"
        return Part(SKIP, f"no early score: {reason}", details=details)
    return Part(
        FAIL if suspicious else PASS,
        measured,
        expected,
        cause="the held-out score is near perfect after almost no training: the inputs likely "
        "contain the label (a leaked feature, an ID, or validation data also in training)",
        fix="look for a feature derived from the target, and for overlap between the splits",
        details=details,
    )
