"""shuffle and batch-independence: what the data order and the batch do to the model."""

from __future__ import annotations

import itertools
import operator
from typing import Any

from dlci.checks.base import FAIL, PASS, SKIP, WARN, CheckResult, Context, difference, number
from dlci.checks.sample import data_sample
from dlci.training.batching import as_pair, batch_size_of, logits_of, tree_map
from dlci.training.draws import Draws

SHUFFLE_BATCHES = 4


def shuffle(ctx: Context) -> CheckResult:
    import torch

    loader = ctx.target.train_loader
    pairs = [
        as_pair(item, i) for i, item in enumerate(itertools.islice(iter(loader), SHUFFLE_BATCHES))
    ]
    targets = [p[1] for p in pairs if isinstance(p[1], torch.Tensor)]
    if not targets:
        return CheckResult("shuffle", SKIP, cause="the targets are not tensors")
    sequential = _is_sequential(loader)
    threshold = ctx.policy.threshold
    if ctx.is_classification():
        classes = ctx.classes()[0] or int(max(int(t.max()) for t in targets) + 1)
        seen = [len(set(t.flatten().tolist())) for t in targets]
        size = sum(t.shape[0] for t in targets) / len(targets)
        shares = _class_shares(ctx)
        if shares is not None:  # the data's own class mix: imbalanced, or fewer classes
            classes = len(shares)
            expected_distinct = sum(1 - (1 - q) ** size for q in shares)
        else:
            expected_distinct = classes * (1 - (1 - 1 / classes) ** size)
        score = (sum(seen) / len(seen)) / expected_distinct
        measured = f"{sum(seen) / len(seen):.1f} classes per batch in the first {len(seen)} batches"
        expected = (
            f"about {expected_distinct:.1f} (a shuffled batch of {size:.0f} from {classes} "
            f"classes; fails under {number(threshold('shuffle', 'fail-mix'))} of it)"
        )
        bad = score < threshold("shuffle", "fail-mix")
        warn = score < threshold("shuffle", "warn-mix")
    else:
        values = torch.cat([t.reshape(t.shape[0], -1).float().mean(dim=1) for t in targets])
        if values.numel() < 16:
            return CheckResult("shuffle", SKIP, cause="too few examples in the first batches")
        rising = float((values[1:] >= values[:-1]).float().mean())
        order = max(rising, 1 - rising)
        measured = f"{order:.0%} of neighbouring targets in order"
        fail_order = threshold("shuffle", "fail-order")
        expected = f"about 50% for shuffled data (fails over {fail_order:.0%})"
        bad, warn = order > fail_order, order > threshold("shuffle", "warn-order")
    cause = "training batches are not shuffled: each step sees one kind of example"
    fix = "pass shuffle=True to the training DataLoader (or a shuffling sampler)"
    if bad:
        return CheckResult("shuffle", FAIL, measured, expected, cause=cause, fix=fix)
    if warn or sequential:
        return CheckResult(
            "shuffle",
            WARN,
            measured + (", sequential sampler" if sequential else ""),
            expected,
            cause=cause,
            fix=fix,
        )
    return CheckResult("shuffle", PASS, measured, expected)


def _class_shares(ctx: Context) -> list[float] | None:
    """The share of each class present in the training data, from the data sample when it
    was read across the data set by index (a loader's first batches would show the order
    this check judges); None otherwise."""
    import torch

    train = data_sample(ctx).train
    labels = None if train is None or not train.by_index else train.targets
    if not isinstance(labels, torch.Tensor) or labels.ndim != 1 or labels.is_floating_point():
        return None
    if labels.numel() < 32 or int(labels.min()) < 0:
        return None
    counts = torch.bincount(labels.long())
    return [float(c) / labels.numel() for c in counts if c > 0]


def _is_sequential(loader: Any) -> bool:
    """Whether the loader reads its data set in order. Given a ``batch_sampler`` (as a
    Transformers Trainer's loaders are), a DataLoader's ``sampler`` is an unused
    SequentialSampler placeholder: torch's BatchSampler is judged by its own sampler, any
    other batch sampler (bucketing by length, sharding) by the indices it yields."""
    from torch.utils.data import BatchSampler, SequentialSampler

    batch_sampler = getattr(loader, "batch_sampler", None)
    if batch_sampler is None:  # no automatic batching: the loader's sampler is the one used
        return isinstance(getattr(loader, "sampler", None), SequentialSampler)
    if type(batch_sampler) is BatchSampler:
        return isinstance(batch_sampler.sampler, SequentialSampler)
    return _yields_in_order(batch_sampler)


def _yields_in_order(batch_sampler: Any) -> bool:
    """The first batches' indices run consecutively (at least 8 of them, all integers)."""
    indices: list[int] = []
    try:
        for batch in itertools.islice(iter(batch_sampler), SHUFFLE_BATCHES):
            indices.extend(operator.index(i) for i in batch)
    except TypeError:  # not a batch sampler of integer indices: no judgement
        return False
    return len(indices) >= 8 and indices == list(range(indices[0], indices[0] + len(indices)))


def _rows(outputs: Any, size: int, keep: Any) -> list[Any]:
    """The kept examples' rows of a batch's outputs: one row per example; or outputs
    flattened to R rows per example (``view(-1, vocab)`` of per-token scores), read
    batch-first (example by example) and time-major (position by position)."""
    if outputs.ndim == 0:
        return []
    if outputs.shape[0] == size:
        return [outputs[keep]]
    per, extra = divmod(outputs.shape[0], size)
    if extra or per < 2:
        return []
    rest = outputs.shape[1:]
    return [
        outputs.reshape(size, per, *rest)[keep],
        outputs.reshape(per, size, *rest)[:, keep],
    ]


def _rest_replaced(batch: Any, size: int, keep: Any, other: Any) -> Any:
    """The batch with the examples outside ``keep`` replaced by copies of ``other``'s: the
    same batch size, so every random draw of the forward (noise, a timestep per example,
    dropout) lands on the same rows as in the full batch when the draws are replayed."""
    import torch

    index = torch.arange(size)
    outside = torch.tensor([i for i in range(size) if i not in set(keep.tolist())])
    index[outside] = other[torch.arange(len(outside)) % len(other)]

    def take(leaf: Any) -> Any:
        if isinstance(leaf, torch.Tensor) and leaf.ndim >= 1 and leaf.shape[0] == size:
            return leaf.index_select(0, index.to(leaf.device))
        return leaf

    return tree_map(take, batch)


def batch_independence(ctx: Context) -> CheckResult:
    """In eval mode, an example's outputs must not change when the rest of its batch does.

    The rest is replaced (by copies of the kept examples), not dropped: the batch keeps its
    size, so a forward that draws random numbers (a VAE's noise, a diffusion step's
    timesteps) draws the same ones for the kept rows when the draws are replayed. Both
    halves are probed in turn: a mix that runs one way along the batch (an RNN fed
    batch-first data as time-major) leaves the first half as it was. The same batch twice,
    on the same draws, is the control: what differs there is no evidence of a leak.
    """
    import torch

    size = batch_size_of(ctx.batch)  # the targets may be a dict (a QA head's start and end)
    if size < 4:
        return CheckResult("batch-independence", SKIP, cause="the batch has fewer than 4 examples")
    rows: list[Any] = []
    tree_map(lambda t: rows.append(getattr(t, "shape", (0,))[:1] == (size,)), ctx.batch[0])
    if not any(rows):
        return CheckResult(
            "batch-independence",
            SKIP,
            cause=f"no tensor of the inputs has a row per example ({size}) to change, in "
            "tuples, lists or dicts (a dataclass or another object is not looked inside)",
        )
    half = size // 2
    first, second = torch.arange(half), torch.arange(half, size)
    draws = Draws.capture()
    ctx.model.eval()
    with torch.no_grad():
        full = logits_of(ctx.evaluate(draws=draws), size)  # a tuple's, a ModelOutput's
        again = logits_of(ctx.evaluate(draws=draws), size)
        probes = [
            (
                keep,
                logits_of(
                    ctx.evaluate(_rest_replaced(ctx.batch, size, keep, other), draws=draws), size
                ),
            )
            for keep, other in ((first, first), (second, second))
        ]
    if not all(isinstance(t, torch.Tensor) for t in (full, again, *(p for _, p in probes))):
        return CheckResult(
            "batch-independence",
            SKIP,
            cause="the outputs hold no tensor of scores with one row per example (a tensor, "
            "logits, or the first such tensor of a tuple)",
        )
    if any(p.shape != full.shape for _, p in probes) or not _rows(full, size, first):
        return CheckResult(
            "batch-independence",
            SKIP,
            cause=f"the outputs {tuple(full.shape)} are neither one row per example nor the "
            f"same number of rows (one per token) for each of the batch's {size} examples",
        )
    tolerance = ctx.policy.threshold("batch-independence", "tolerance")
    expected = f"identical outputs (max difference below {number(tolerance)} of the output scale)"
    noise, noise_scale = difference(full, again)
    if noise > tolerance * noise_scale:
        return CheckResult(
            "batch-independence",
            WARN,
            f"the same batch gave outputs {noise:.3g} apart on two calls with the same random "
            "draws",
            expected,
            cause="could not judge: the outputs change from call to call for the same inputs "
            "and the same random draws (a generator of the model's own, state carried across "
            "calls, or nondeterministic kernels), so a change when the rest of the batch "
            "changes is not evidence of a leak between examples",
            fix="draw from torch's global generator (or seed the model's own in forward), and "
            "reset any state carried across calls, so one batch gives one output",
            details={"inconclusive": True, "noise": noise},
        )
    # a logit masked to -inf is no difference; of two readings of flattened rows, the closer
    diff, scale = max(
        min(
            difference(a, b)
            for a, b in zip(_rows(full, size, keep), _rows(probe, size, keep), strict=True)
        )
        for keep, probe in probes
    )
    if diff <= tolerance * scale:
        return CheckResult("batch-independence", PASS, f"max difference {diff:.2g}", expected)
    return CheckResult(
        "batch-independence",
        FAIL,
        f"max difference {diff:.3g} in half a batch's outputs when the other half changed "
        "(the same random draws)",
        expected,
        cause="in eval mode an example's output depends on the rest of its batch: "
        "normalization recomputed per batch at inference (BatchNorm in train mode, a norm "
        "over the batch axis), a reshape or permute that mixes the batch axis with another "
        "(heads merged in the wrong order), or an operation across examples (a softmax or "
        "mean over dim 0)",
        fix="use running statistics at eval (BatchNorm's default track_running_stats=True) or "
        "a per-sample normalization such as LayerNorm; keep the batch axis first and whole in "
        "every view/reshape/permute (reshape(B, L, H * D) after transposing heads back)",
        details={"noise": noise},
    )
