"""input-normalization: the scale of the inputs per feature (per channel for images), and
whether the held-out split was normalised like the training split.

LeCun et al., "Efficient BackProp" (1998), section 4.3: each input should average near zero
and inputs should have comparable, near-unit variances. PyTorch's default initialisation
keeps a layer's output on the scale of its input, so an input at scale 100 starts every
unit of the first layer about 100 times too far out (saturated tanh and softmax, and the
first layer's learning rate wrong for the rest). The thresholds are docs/doctor.md's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from dlci.checks.base import FAIL, PASS, SKIP, WARN, CheckResult, Context, fmt, number
from dlci.checks.sample import Sample, data_sample

# The thresholds are the project's (dlci.policy, under "input-normalization"); by
# default: a feature's root mean square warns over 10 and fails over 30 (1 and 1.5 decades
# out); one dense feature's rms over 100x the median feature's warns; the median
# |held-out mean - training mean| / training sd warns over 0.3 and fails over 1; the median
# held-out sd / training sd, either way, warns over 1.5x and fails over 3x; one dense
# feature's mean shift fails over 5 training sd (sampling noise: ~0.2).
BOUNDS = (
    "warn-rms",
    "fail-rms",
    "warn-dominance",
    "warn-shift",
    "fail-shift",
    "warn-sd-ratio",
    "fail-sd-ratio",
    "fail-one-shift",
)
CONSTANT_SHARE = 0.5  # warn when more than half the features never vary
MIN_HELD_OUT = 32  # examples needed to compare the splits
CHUNK = 256  # examples per step of the statistics
FIX_SCALE = (
    "standardise each feature with the training split's mean and sd (divide 8-bit pixels by "
    "255, then normalise per channel), and apply the same transform to every split"
)


@dataclass
class Finding:
    status: str
    measured: str
    cause: str
    fix: str


@dataclass
class Columns:
    """One input's statistics per feature (per channel for images)."""

    kind: str  # "feature" or "channel"
    prefix: str  # "" for the plain inputs, else "inputs['x'] "
    ref: Any  # (F,) the first example's value, subtracted before squaring (no cancellation)
    m1: Any  # (N, F) each example's mean of the feature, less ref
    m2: Any  # (N, F) each example's mean of its square, less ref
    low: Any
    high: Any
    binary: Any  # (F,) only 0 and 1
    dense: Any  # (F,) non-zero in at least half the values
    nonfinite: int

    def name(self, column: int) -> str:
        return f"{self.prefix}{self.kind} {column}"


def columns(name: str, leaf: Any) -> Columns:
    """Statistics of an input leaf: (N,) and (N, F) per feature, (N, L, D) per feature over
    the positions, (N, C, ...) per channel over the rest; computed a chunk of examples at a
    time, so a float copy of the whole sample is never made."""
    import torch

    kind = "channel" if leaf.ndim >= 4 else "feature"
    # channels last, (N, H, W, C) as a Perceiver or a JAX port takes images: a last axis of
    # at most 4 (gray, RGB, RGBA) after a wider one holds the channels
    last = leaf.ndim >= 4 and leaf.shape[-1] <= 4 < leaf.shape[1]
    parts: list[tuple[Any, ...]] = []
    ref = None
    for start in range(0, leaf.shape[0], CHUNK):
        x = _positions(leaf[start : start + CHUNK].float(), last)  # (n, positions, F)
        finite = torch.isfinite(x)
        x = torch.where(finite, x, torch.zeros((), device=x.device))
        ref = x[0].mean(0) if ref is None else ref
        shifted = x - ref
        flat = x.reshape(-1, x.shape[2])
        parts.append(
            (
                shifted.mean(1),
                (shifted * shifted).mean(1),
                flat.min(0).values,
                flat.max(0).values,
                ((flat == 0) | (flat == 1)).all(0),
                (flat != 0).float().sum(0),
                int((~finite).sum()),
                flat.shape[0],
            )
        )
    m1, m2, low, high, binary, nonzero, bad, rows = zip(*parts, strict=True)
    return Columns(
        kind,
        "" if name == "inputs" else f"{name} ",
        ref,
        torch.cat(m1),
        torch.cat(m2),
        torch.stack(low).min(0).values,
        torch.stack(high).max(0).values,
        torch.stack(binary).all(0),
        torch.stack(nonzero).sum(0) / sum(rows) >= 0.5,
        sum(bad),
    )


def _positions(x: Any, channels_last: bool = False) -> Any:
    """(n, positions, features): a feature's values of one example along the middle axis."""
    if channels_last:
        return x.flatten(1, -2)  # (n, H, W, C) -> (n, positions, C)
    if x.ndim == 1:
        return x[:, None, None]
    if x.ndim == 2:
        return x[:, None, :]
    if x.ndim == 3:
        return x
    return x.flatten(2).transpose(1, 2)  # (n, C, ...) -> (n, positions, C)


def weighted(cols: Columns, weights: Any) -> tuple[Any, Any]:
    """Mean and standard deviation per feature, the examples weighted."""
    total = weights.sum()
    mean = (weights[:, None] * cols.m1).sum(0) / total
    square = (weights[:, None] * cols.m2).sum(0) / total
    return cols.ref + mean, (square - mean * mean).clamp_min(0).sqrt()


def input_normalization(ctx: Context) -> CheckResult:
    sample = data_sample(ctx)
    if sample.train is None:
        return CheckResult("input-normalization", SKIP, cause=sample.skip)
    floats = {n: leaf for n, leaf in sample.train.leaves.items() if leaf.is_floating_point()}
    if not floats:
        return CheckResult(
            "input-normalization",
            SKIP,
            cause="the inputs are integers (token IDs or category codes): an embedding sets "
            "their scale, not a normalization",
        )
    findings: list[Finding] = []
    notes: list[str] = []
    bound = {key: ctx.policy.threshold("input-normalization", key) for key in BOUNDS}
    train_w, val_w = _class_weights(ctx, sample)
    for name, leaf in floats.items():
        train = columns(name, leaf)
        findings += _scale(train, notes, bound)
        if sample.val is not None and sample.val.size >= MIN_HELD_OUT:
            held_out = columns(name, sample.val.leaves[name])
            if held_out.m1.shape[1] == train.m1.shape[1] and not train.nonfinite:
                findings += _shift(train, held_out, (train_w, val_w), notes, bound)
    if sample.val is not None and sample.val.size < MIN_HELD_OUT:
        notes.append(f"too few held-out examples to compare ({sample.val.size})")
    integers = [n for n, leaf in sample.train.leaves.items() if not leaf.is_floating_point()]
    if integers:
        notes.append(f"integer inputs not judged: {', '.join(integers)}")
    return _verdict(findings, notes, _expected(bound))


def _expected(bound: dict[str, float]) -> str:
    return (
        f"per feature or channel: rms under {number(bound['warn-rms'])}, not constant; held-out "
        f"means within {number(bound['warn-shift'])} training sd of the training means, sd ratio "
        f"within {number(bound['warn-sd-ratio'])}x (each beyond twice the sampling noise)"
    )


def _verdict(findings: list[Finding], notes: list[str], expected: str) -> CheckResult:
    order = {FAIL: 0, WARN: 1}
    findings.sort(key=lambda f: order[f.status])
    details = {"findings": [f.measured for f in findings], "notes": notes}
    if not findings:
        return CheckResult("input-normalization", PASS, "; ".join(notes), expected, details=details)
    worst = findings[0]
    more = f" (and {len(findings) - 1} more in details)" if len(findings) > 1 else ""
    return CheckResult(
        "input-normalization",
        worst.status,
        worst.measured + more,
        expected,
        cause=worst.cause,
        fix=worst.fix,
        details=details,
    )


def _scale(cols: Columns, notes: list[str], bound: dict[str, float]) -> list[Finding]:
    """Non-finite values, constant features, and features far from unit scale."""
    import torch

    if cols.nonfinite:
        return [
            Finding(
                FAIL,
                f"{cols.nonfinite} non-finite values (NaN or inf) in the training inputs",
                "the inputs hold NaN or inf: a missing value, a division by zero in the "
                "preprocessing, or a corrupt file",
                "replace or drop missing values before training; guard divisions in the "
                "normalization",
            )
        ]
    mean, sd = weighted(cols, torch.ones(cols.m1.shape[0], device=cols.m1.device))
    rms = (sd * sd + mean * mean).sqrt()
    constant = sd <= 1e-6 * (1 + mean.abs())
    count = int(constant.shape[0])
    found: list[Finding] = []
    if bool(constant.all()):
        found.append(_constant(cols, constant, mean, everything=True))
    elif count >= 4 and int((constant & (mean != 0)).sum()) > CONSTANT_SHARE * count:
        # all-zero columns are unused ones (a blank border, a category or word not in the
        # sample): only constants that are not zero are odd
        found.append(_constant(cols, constant & (mean != 0), mean, everything=False))
    judged = ~cols.binary & ~constant
    if bool(judged.any()):
        worst = int(torch.where(judged, rms, torch.zeros_like(rms)).argmax())
        value = float(rms[worst])
        plural = "s" if count != 1 else ""
        notes.append(
            f"{count} {cols.prefix}{cols.kind}{plural}, rms up to {fmt(value)} ({cols.name(worst)})"
        )
        if value > bound["warn-rms"]:
            found.append(
                Finding(
                    FAIL if value > bound["fail-rms"] else WARN,
                    f"{cols.name(worst)}: rms {fmt(value)} (mean {fmt(float(mean[worst]))}, "
                    f"sd {fmt(float(sd[worst]))}, range {fmt(float(cols.low[worst]))} to "
                    f"{fmt(float(cols.high[worst]))})",
                    "the inputs are far from unit scale (raw 0-255 pixels, unscaled "
                    "measurements): activations saturate and the first layer learns at another "
                    "rate than the rest",
                    FIX_SCALE,
                )
            )
        found += _dominant(cols, rms, judged & cols.dense, bound["warn-dominance"])
    return found


def _constant(cols: Columns, constant: Any, mean: Any, *, everything: bool) -> Finding:
    names = [cols.name(int(i)) for i in constant.nonzero().flatten()[:3].tolist()]
    count = int(constant.shape[0])
    if everything:
        return Finding(
            FAIL,
            f"every {cols.prefix}{cols.kind} is constant ({', '.join(names)}: "
            f"{fmt(float(mean[int(constant.nonzero()[0])]))})",
            "the inputs do not vary: the model sees the same input for every example",
            "check the pipeline: a wrong column, blank images, or a normalization that "
            "divides everything away",
        )
    return Finding(
        WARN,
        f"{int(constant.sum())} of {count} {cols.prefix}{cols.kind}s are constant "
        f"(e.g. {', '.join(names)})",
        "most inputs carry no information: a wrong column selection or a broken transform",
        "check the pipeline; drop features that never vary",
    )


def _dominant(cols: Columns, rms: Any, dense: Any, dominates: float) -> list[Finding]:
    """One dense feature orders of magnitude above the median dense feature."""
    import torch

    if int(dense.sum()) < 3:
        return []
    median = float(rms[dense].median())
    worst = int(torch.where(dense, rms, torch.zeros_like(rms)).argmax())
    if median <= 0 or float(rms[worst]) / median <= dominates:
        return []
    return [
        Finding(
            WARN,
            f"{cols.name(worst)}: rms {fmt(float(rms[worst]))}, "
            f"{float(rms[worst]) / median:.0f}x the median {cols.kind}'s {fmt(median)}",
            "one feature dominates the others by orders of magnitude: the others barely move "
            "the first layer",
            FIX_SCALE,
        )
    ]


def _shift(
    train: Columns,
    val: Columns,
    weights: tuple[Any, Any],
    notes: list[str],
    bound: dict[str, float],
) -> list[Finding]:
    """The held-out split's statistics against the training split's, feature by feature."""
    import torch

    train_w, val_w = weights
    if train_w is None:
        train_w = torch.ones(train.m1.shape[0], device=train.m1.device)
        val_w = torch.ones(val.m1.shape[0], device=val.m1.device)
    sizes = (_effective(train_w), _effective(val_w))
    if min(sizes) < MIN_HELD_OUT / 2:
        notes.append(f"too few examples to compare the splits ({min(sizes):.0f} effective)")
        return []
    noise = math.sqrt(1 / sizes[0] + 1 / sizes[1])  # the sd of a mean shift, in training sd
    mt, st = weighted(train, train_w)
    mv, sv = weighted(val, val_w)
    usable = st > 1e-6 * (1 + mt.abs())
    if not bool(usable.any()):
        return []
    z = ((mv - mt) / st.clamp_min(1e-12)).abs()
    ratio = (sv / st.clamp_min(1e-12)).clamp_min(1e-6)
    median_z = float(z[usable].median())
    median_ratio = float(ratio[usable].log().median().exp())
    spread = max(median_ratio, 1 / median_ratio)
    score = torch.where(usable, z + ratio.log().abs(), torch.zeros_like(z))
    worst = int(score.argmax())
    one = usable & train.dense & (z > bound["fail-one-shift"])
    measured = (
        f"held-out vs training, median over {int(usable.sum())} {train.kind}s: mean shift "
        f"{median_z:.2g} sd, sd ratio {median_ratio:.2g}; {train.name(worst)}: training mean "
        f"{fmt(float(mt[worst]))} sd {fmt(float(st[worst]))}, held-out mean "
        f"{fmt(float(mv[worst]))} sd {fmt(float(sv[worst]))}"
    )
    notes.append(f"held-out mean shift {median_z:.2g} sd, sd ratio {median_ratio:.2g}")
    spread = math.log(spread) - 2 * noise / math.sqrt(2)  # the log-ratio's noise: noise / sqrt 2
    status = _shift_status(median_z - 2 * noise, spread, bool(one.any()), bound)
    if status is None:
        return []
    return [
        Finding(
            status,
            measured,
            "the held-out split is not normalised like the training split: statistics of "
            "another split or data set, or a preprocessing step missing on one side",
            "compute the normalization statistics once, on the training split, and apply the "
            "same transform to every split",
        )
    ]


def _shift_status(
    shift: float, log_spread: float, one: bool, bound: dict[str, float]
) -> str | None:
    """fail, warn or None: the median mean shift and log sd ratio, each less twice its
    noise, against the project's bounds; one dense feature shifted far fails alone."""
    if shift > bound["fail-shift"] or log_spread > math.log(bound["fail-sd-ratio"]) or one:
        return FAIL
    if shift > bound["warn-shift"] or log_spread > math.log(bound["warn-sd-ratio"]):
        return WARN
    return None


def _effective(weights: Any) -> float:
    """Kish's effective sample size of weighted examples."""
    return float(weights.sum()) ** 2 / max(float((weights * weights).sum()), 1e-12)


def _class_weights(ctx: Context, sample: Sample) -> tuple[Any, Any]:
    """Weights that give the training sample the held-out sample's class mix (a held-out
    loader sorted by class is read from its start); (None, None) without classes."""
    import torch

    train, val = sample.train, sample.val
    if train is None or val is None or not ctx.is_classification():
        return None, None
    yt, yv = train.targets, val.targets
    if yt is None or yv is None or yt.ndim != 1 or yv.ndim != 1:
        return None, None
    if yt.is_floating_point() or yv.is_floating_point() or min(int(yt.min()), int(yv.min())) < 0:
        return None, None
    classes = max(int(yt.max()), int(yv.max())) + 1
    pt = torch.bincount(yt, minlength=classes).float() / yt.numel()
    pv = torch.bincount(yv, minlength=classes).float() / yv.numel()
    shared = (pt > 0) & (pv > 0)
    if not bool(shared.any()) or math.isclose(float(pv[shared].sum()), 0.0):
        return None, None
    per_class = torch.where(shared, pv / pt.clamp_min(1e-12), torch.zeros_like(pt))
    return per_class[yt], shared[yv].float()
