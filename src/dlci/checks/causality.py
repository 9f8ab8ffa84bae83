"""causality: a sequence model that predicts the next token must not see it.

A causal language model whose attention mask is missing (or built the wrong way round) trains
well and memorises, because every position can read the token it is asked to predict: the
sequence form of label leakage. The check changes only the tokens after position t and
compares the outputs at positions 0..t, in eval mode: two forwards.

It runs where the model is autoregressive: the model says so (a Transformers ``config`` with
``is_decoder``, a ``*ForCausalLM`` or ``*LMHeadModel`` class, an ``is_causal`` attribute), or
the targets are the inputs (a Transformers causal LM shifts them inside its loss) or the
inputs shifted by one (the next token at each position).
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Mapping, MutableMapping
from typing import Any

from dlci.checks.base import FAIL, PASS, SKIP, WARN, CheckResult, Context, difference, fmt
from dlci.training.batching import logits_of
from dlci.training.draws import Draws

TOLERANCE = 1e-4  # of the output scale: float noise, not a dependence
COPY_LOSS = 0.05  # the loss of outputs that copy their inputs, under which labels are unshifted
TOKEN_KEYS = ("input_ids", "tokens", "idx", "x")


def _is_tokens(t: Any) -> bool:
    import torch

    return (
        isinstance(t, torch.Tensor)
        and t.ndim == 2
        and not t.is_floating_point()
        and t.dtype != torch.bool
        and t.shape[1] >= 2
    )


def _children(value: Any) -> list[tuple[Any, Any]]:
    """(key, child) of a dict (the usual token keys first), a tuple or list, a dataclass."""
    if isinstance(value, Mapping):
        keys = [k for k in TOKEN_KEYS if k in value] + [k for k in value if k not in TOKEN_KEYS]
        return [(k, value[k]) for k in keys]
    if isinstance(value, tuple | list):
        return list(enumerate(value))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return [(f.name, getattr(value, f.name)) for f in dataclasses.fields(value)]
    return []


def _tokens(inputs: Any, depth: int = 0) -> tuple[Any, tuple[Any, ...]] | None:
    """The (N, L) integer token tensor of the inputs and where it sits: the path of keys,
    indices and fields into dicts, tuples or lists and dataclasses (``()``: the inputs are
    that tensor); None when there is none. ``model(X, Y)`` (nanoGPT's forward given the
    targets) is found at ``(0,)``."""
    if _is_tokens(inputs):
        return inputs, ()
    if depth >= 3:
        return None
    for key, child in _children(inputs):
        found = _tokens(child, depth + 1)
        if found is not None:
            return found[0], (key, *found[1])
    return None


def _with(inputs: Any, path: tuple[Any, ...], new: Any) -> Any:
    """``inputs`` with the tensor at ``path`` replaced by ``new``, in the same structure."""
    if not path:
        return new
    key, rest = path[0], path[1:]
    if isinstance(inputs, Mapping):
        return {**inputs, key: _with(inputs[key], rest, new)}
    if isinstance(inputs, tuple | list):
        items = list(inputs)
        items[key] = _with(items[key], rest, new)
        return type(inputs)(items) if isinstance(inputs, list) else tuple(items)
    return dataclasses.replace(inputs, **{key: _with(getattr(inputs, key), rest, new)})


def _kinds(inputs: Any) -> str:
    """What the inputs hold, briefly, for a message: ``(float (16, 3, 8, 8), int (16,))``."""
    import torch

    if isinstance(inputs, torch.Tensor):
        kind = "float" if inputs.is_floating_point() else str(inputs.dtype).replace("torch.", "")
        return f"{kind} {tuple(inputs.shape)}"
    children = _children(inputs)
    if not children:
        return type(inputs).__name__
    return "(" + ", ".join(f"{k}: {_kinds(c)}" for k, c in children[:6]) + ")"


def _autoregressive(model: Any, tokens: Any, targets: Any) -> str:
    """Why the model is taken to be autoregressive, or ``""``."""
    import torch

    config = getattr(model, "config", None)
    name = type(model).__name__
    if getattr(config, "is_decoder", False) and not getattr(config, "is_encoder_decoder", False):
        return f"{name}'s config says is_decoder"
    if name.endswith(("ForCausalLM", "LMHeadModel")):
        return f"{name} is a causal language model"
    if getattr(model, "is_causal", False) is True:
        return f"{name}.is_causal is True"
    if isinstance(targets, torch.Tensor) and targets.shape == tokens.shape:
        kept = targets >= 0  # a negative label is an ignore index (-100 Transformers', -1 ...)
        if bool(kept.any()) and bool((targets[kept] == tokens[kept]).all()):
            return "the targets are the inputs (the loss shifts them to the next token)"
        shifted, later = targets[:, :-1], tokens[:, 1:]
        kept = shifted >= 0
        if bool(kept.any()) and float((shifted[kept] == later[kept]).float().mean()) >= 0.95:
            return "the targets are the inputs shifted by one (the next token)"
    return ""


def causality(ctx: Context) -> CheckResult:
    import torch

    inputs, targets = ctx.batch
    found = _tokens(inputs)
    if found is None:
        return CheckResult(
            "causality",
            SKIP,
            cause="the inputs hold no (N, L) token sequences of integers (looked inside "
            f"tuples, dicts and dataclasses; the inputs are {_kinds(inputs)})",
        )
    tokens, key = found
    draws = Draws.capture()  # the same tokens meet the same random draws on every call
    why = _autoregressive(ctx.model, tokens, targets)
    if not why:
        return CheckResult(
            "causality",
            SKIP,
            cause="not an autoregressive model: its targets are not its inputs (shifted or "
            "not) and it does not say it is causal (is_decoder, is_causal)",
        )
    length, rows = tokens.shape[1], tokens.shape[0]
    cut = (length - 1) // 2  # positions 0..cut keep their tokens; at least one after changes
    ctx.model.eval()
    with torch.no_grad():
        raw = ctx.evaluate(draws=draws)
        layout = _layout(ctx, raw, tokens, key, draws)
        if isinstance(layout, str):
            return CheckResult("causality", SKIP, cause=layout)
        before = layout(raw)
        again = layout(ctx.evaluate(draws=draws))
        vocab = max(int(tokens.max()) + 1, before.shape[-1] if before.ndim == 3 else 0)
        if vocab < 2:
            return CheckResult("causality", SKIP, cause="a vocabulary of one token")
        changed = _later_changed(tokens, cut, vocab)
        after = layout(ctx.evaluate((_with(inputs, key, changed), targets), draws=draws))
        fed = _labels_read(ctx, layout, before, (inputs, targets), tokens, why, vocab, draws)
    if not all(
        isinstance(t, torch.Tensor) and t.shape == before.shape for t in (before, again, after)
    ) or not (before.ndim >= 2 and before.shape[1] == length):
        return CheckResult(
            "causality",
            SKIP,
            cause="the outputs hold no per-position scores (N, L, ...) for the inputs' "
            f"{length} positions",
        )
    noise, _ = difference(before, again)
    change, scale = difference(before[:, : cut + 1], after[:, : cut + 1])
    details = {"cut": cut, "length": length, "why": why, "max_change": change}
    if noise > TOLERANCE * scale:  # state carried across calls, or randomness in eval mode
        return CheckResult(
            "causality",
            WARN,
            f"the same tokens gave outputs {fmt(noise)} apart on two calls",
            "the same outputs for the same tokens",
            cause="could not judge: the model's outputs change from call to call for the same "
            "inputs (a hidden state carried across calls, or randomness in eval mode), so a "
            "change after a later token is not evidence of seeing the future",
            fix="reset the state in forward (or in eval_step) so one call sees one batch",
            details=dict(details, inconclusive=True, noise=noise),
        )
    copying = _copy_loss(ctx, raw, before, tokens, targets, why)
    measured_text = (
        f"outputs at positions 0-{cut} moved by up to {fmt(change)} when only the tokens after "
        f"{cut} changed ({why})"
    )
    expected = f"no change (below {TOLERANCE:g} of the output scale) before position {cut + 1}"
    if copying is not None:
        return copying
    if change <= TOLERANCE * scale:
        if fed is not None:
            return fed
        return CheckResult("causality", PASS, measured_text, expected, details=details)
    gaps = (before[:, : cut + 1] - after[:, : cut + 1]).abs().float().nan_to_num(nan=math.inf)
    per_position = gaps.reshape(rows, cut + 1, -1).amax(dim=(0, 2))
    first = int((per_position > TOLERANCE * scale).nonzero()[0]) if change < math.inf else 0
    details["first_position"] = first
    if fed is not None:  # the targets it is given leak too: said beside the first finding
        details["targets_read"] = True
        measured_text += "; it also reads the targets it is given (see details)"
    return CheckResult(
        "causality",
        FAIL,
        measured_text + f"; the first position to change is {first}",
        expected,
        cause="the model sees the future: the output at a position depends on later tokens, "
        "so it can read the token it is trained to predict (a causal mask missing, or "
        "applied the wrong way round)",
        fix="mask attention to later positions (is_causal=True in scaled_dot_product_attention, "
        "or a lower-triangular mask) and check the mask's orientation",
        details=details,
    )


def _later_changed(tokens: Any, cut: int, vocab: int) -> Any:
    """``tokens`` with every token after position ``cut`` changed to another one."""
    import torch

    changed = tokens.clone()
    generator = torch.Generator().manual_seed(0)
    shift = torch.randint(1, vocab, changed[:, cut + 1 :].shape, generator=generator)
    changed[:, cut + 1 :] = (changed[:, cut + 1 :] + shift.to(tokens.device)) % vocab
    return changed


def _layout(ctx: Context, raw: Any, tokens: Any, key: tuple[Any, ...], draws: Any) -> Any:
    """A function from the model's outputs to its per-position scores (N, L, ...), or why
    there is none. Outputs of one row per example are taken as they are; outputs flattened to
    one row per token (``output.view(-1, vocab)``, as many language models return them) are
    unflattened in the order a probe finds: every token of example 0 changed, the rows that
    move are its positions (rows 0..L-1 batch-first, rows 0, N, 2N, ... time-major)."""
    import torch

    rows, length = tokens.shape
    scores = logits_of(raw, rows)
    if isinstance(scores, torch.Tensor) and scores.ndim >= 2 and scores.shape[0] == rows:
        return lambda outputs: logits_of(outputs, rows)
    flat = [t for t in _tensors(raw) if t.ndim >= 1 and t.shape[0] == rows * length]
    if not flat or rows < 2:
        return (
            f"the outputs hold no per-position scores for the inputs' {length} positions "
            f"(neither (N, L, ...) nor N*L = {rows * length} rows)"
        )
    index = _tensors(raw).index(flat[0])
    probe = tokens.clone()
    probe[0] = (probe[0] + 1) % max(int(tokens.max()) + 1, 2)
    inputs, targets = ctx.batch
    moved_raw = ctx.evaluate((_with(inputs, key, probe), targets), draws=draws)
    moved = _tensors(moved_raw)[index]
    gaps = (moved - flat[0]).abs().reshape(rows * length, -1).amax(dim=1)
    changed = set(
        (gaps > TOLERANCE * max(float(flat[0].abs().max()), 1.0)).nonzero()[:, 0].tolist()
    )
    if changed and changed <= set(range(length)):
        return lambda outputs: _tensors(outputs)[index].reshape(rows, length, -1)
    if changed and changed <= set(range(0, rows * length, rows)):
        return lambda outputs: _tensors(outputs)[index].reshape(length, rows, -1).transpose(0, 1)
    return (
        f"the outputs are flattened to {rows * length} rows (one per token), and changing one "
        "example's tokens moved rows that are neither its positions batch-first nor "
        "time-major, so which row is which position cannot be told"
    )


def _tensors(outputs: Any) -> list[Any]:
    """The tensors of the outputs, in a fixed order (a tensor; a tuple or list's; a dict's or
    ModelOutput's values)."""
    import torch

    if isinstance(outputs, torch.Tensor):
        return [outputs]
    if isinstance(outputs, tuple | list):
        items: Any = outputs
    elif isinstance(outputs, Mapping):
        items = outputs.values()
    else:
        return []
    return [t for t in items if isinstance(t, torch.Tensor)]


def _labels_read(
    ctx: Context,
    layout: Any,
    before: Any,
    batch: Any,
    tokens: Any,
    why: str,
    vocab: int,
    draws: Any,
) -> CheckResult | None:
    """A model that is given its targets (a forward(inputs, target) with teacher forcing)
    must not read the one it predicts: the output at a position may depend on earlier
    targets only. The targets after a cut are changed, and the outputs up to the first
    changed target compared (up to the position before it when the targets are the inputs,
    whose loss shifts them)."""
    import torch

    inputs, targets = batch
    if not (isinstance(targets, torch.Tensor) and targets.shape == tokens.shape):
        return None
    if targets.is_floating_point() or targets.dtype == torch.bool:
        return None
    length = tokens.shape[1]
    cut = (length - 1) // 2
    changed = _later_changed(targets.clamp(min=0), cut, vocab)
    changed = torch.where(targets < 0, targets, changed)  # ignored positions stay ignored
    # the targets given to the forward too (nanoGPT's model(X, Y)) change with them
    inputs = _replace_equal(inputs, targets, changed)
    after = layout(ctx.evaluate((inputs, changed), draws=draws))
    if not (isinstance(after, torch.Tensor) and after.shape == before.shape):
        return None
    upto = cut + 1 if why.startswith("the targets are the inputs shifted") else cut
    change, scale = difference(before[:, : upto + 1], after[:, : upto + 1])
    if change <= TOLERANCE * scale:
        return None
    return CheckResult(
        "causality",
        FAIL,
        f"outputs at positions 0-{upto} moved by up to {fmt(change)} when only the targets "
        f"after {cut} changed ({why}): the output at position {upto} reads the target it is "
        "scored against",
        "outputs that depend on earlier targets at most (teacher forcing shifts the targets right)",
        cause="the model is given the labels it predicts: its forward takes the targets (a "
        "decoder fed them for teacher forcing) without shifting them right, or without a "
        "causal mask, so each position can copy its own label",
        fix="feed the decoder the targets shifted right by one (a start token first) under a "
        "causal mask, or train a decoder-only model on the inputs alone",
        details={"cut": cut, "length": length, "why": why, "max_change": change, "targets": True},
    )


def _replace_equal(inputs: Any, old: Any, new: Any, depth: int = 0) -> Any:
    """``inputs`` with every tensor equal to ``old`` (the targets, given to the forward as
    well) replaced by ``new``."""
    import torch

    if isinstance(inputs, torch.Tensor):
        same = inputs.shape == old.shape and inputs.dtype == old.dtype
        return new if same and bool(torch.equal(inputs, old)) else inputs
    if depth >= 3:
        return inputs
    for key, child in _children(inputs):
        replaced = _replace_equal(child, old, new, depth + 1)
        if replaced is not child:
            inputs = _with(inputs, (key,), replaced)
    return inputs


def _copy_loss(
    ctx: Context, raw: Any, outputs: Any, tokens: Any, targets: Any, why: str
) -> CheckResult | None:
    """Targets that are the inputs themselves, under a loss that does not shift them: every
    position is trained to output the token it reads (labels not shifted). Measured with the
    loss itself: outputs that copy each input token score a near-zero loss only then."""
    import torch

    if not why.startswith("the targets are the inputs (") or ctx.target.loss_fn is None:
        return None
    if outputs.ndim != 3 or int(tokens.max()) >= outputs.shape[-1]:
        return None
    # (a Transformers causal LM's loss is the one its forward computed from the labels, which
    # shifts them: copied scores leave it as it is, so it is never taken for unshifted)
    copied = torch.full_like(outputs, -30.0).scatter_(2, tokens.long().unsqueeze(-1), 30.0)
    try:
        loss = float(ctx.target.loss_fn(_replaced(raw, outputs, copied), targets))
    except Exception:  # a loss that wants other outputs: nothing measured
        return None
    if not loss < COPY_LOSS:
        return None
    return CheckResult(
        "causality",
        FAIL,
        f"outputs that copy each input token score a loss of {fmt(loss)} against the targets",
        "the targets are the next tokens: copying the input scores no better than chance",
        cause="the labels are not shifted: the target at each position is the token the model "
        "reads there, so it learns to copy its input instead of predicting the next token",
        fix="shift them: targets = tokens[:, 1:] for inputs = tokens[:, :-1] (or shift inside "
        "the loss: logits[:, :-1] against targets[:, 1:])",
        details={"copy_loss": loss, "why": why},
    )


def _replaced(raw: Any, scores: Any, new: Any) -> Any:
    """The outputs ``raw`` with their scores tensor ``scores`` replaced by ``new``, in the
    same structure (a tensor, a tuple or list, a dict or ModelOutput), for the loss to read."""
    if raw is scores:
        return new
    if isinstance(raw, tuple | list):
        return type(raw)(new if item is scores else item for item in raw)
    if isinstance(raw, MutableMapping):  # a dict, a ModelOutput (its attributes kept)
        copied = copy.copy(raw)
        for key, value in raw.items():
            if value is scores:
                copied[key] = new
        return copied
    return new
