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

from collections.abc import Mapping
from typing import Any

from dlci.checks.base import FAIL, PASS, SKIP, CheckResult, Context, fmt
from dlci.training.batching import logits_of

TOLERANCE = 1e-4  # of the output scale: float noise, not a dependence
TOKEN_KEYS = ("input_ids", "tokens", "idx", "x")
IGNORE_INDEX = -100  # label positions a language-modelling loss skips


def _tokens(inputs: Any) -> tuple[Any, str | None] | None:
    """The (N, L) integer token tensor of the inputs and its key in a dict (None: the inputs
    are that tensor), or None."""
    import torch

    def is_tokens(t: Any) -> bool:
        return (
            isinstance(t, torch.Tensor)
            and t.ndim == 2
            and not t.is_floating_point()
            and t.dtype != torch.bool
            and t.shape[1] >= 2
        )

    if is_tokens(inputs):
        return inputs, None
    if isinstance(inputs, Mapping):
        for key in TOKEN_KEYS:
            if is_tokens(inputs.get(key)):
                return inputs[key], key
    return None


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
        kept = targets != IGNORE_INDEX
        if bool(kept.any()) and bool((targets[kept] == tokens[kept]).all()):
            return "the targets are the inputs (the loss shifts them to the next token)"
        shifted, later = targets[:, :-1], tokens[:, 1:]
        kept = shifted != IGNORE_INDEX
        if bool(kept.any()) and float((shifted[kept] == later[kept]).float().mean()) >= 0.95:
            return "the targets are the inputs shifted by one (the next token)"
    return ""


def causality(ctx: Context) -> CheckResult:
    import torch

    inputs, targets = ctx.batch
    found = _tokens(inputs)
    if found is None:
        return CheckResult(
            "causality", SKIP, cause="the inputs are not (N, L) token sequences of integers"
        )
    tokens, key = found
    why = _autoregressive(ctx.model, tokens, targets)
    if not why:
        return CheckResult(
            "causality",
            SKIP,
            cause="not an autoregressive model: its targets are not its inputs (shifted or "
            "not) and it does not say it is causal (is_decoder, is_causal)",
        )
    length = tokens.shape[1]
    cut = length // 2  # positions 0..cut keep their tokens; the ones after change
    ctx.model.eval()
    with torch.no_grad():
        before = logits_of(ctx.forward(), tokens.shape[0])
        vocab = max(int(tokens.max()) + 1, before.shape[-1] if before.ndim == 3 else 0, 2)
        changed = tokens.clone()
        generator = torch.Generator().manual_seed(0)
        shift = torch.randint(1, vocab, changed[:, cut + 1 :].shape, generator=generator)
        changed[:, cut + 1 :] = (changed[:, cut + 1 :] + shift.to(tokens.device)) % vocab
        after_inputs = changed if key is None else {**inputs, key: changed}
        after = logits_of(ctx.forward(batch=(after_inputs, targets)), tokens.shape[0])
    if not (
        isinstance(before, torch.Tensor)
        and isinstance(after, torch.Tensor)
        and before.shape == after.shape
        and before.ndim >= 2
        and before.shape[1] == length
    ):
        return CheckResult(
            "causality",
            SKIP,
            cause="the outputs hold no per-position scores (N, L, ...) for the inputs' "
            f"{length} positions",
        )
    seen = (before[:, : cut + 1] - after[:, : cut + 1]).abs().float()
    per_position = seen.reshape(seen.shape[0], cut + 1, -1).amax(dim=(0, 2))
    scale = 1.0 + float(before.abs().max())
    measured_text = (
        f"outputs at positions 0-{cut} moved by up to {fmt(float(per_position.max()))} "
        f"when only the tokens after {cut} changed ({why})"
    )
    expected = f"no change (below {TOLERANCE:g} of the output scale) before position {cut + 1}"
    leaked = (per_position > TOLERANCE * scale).nonzero()
    details = {"cut": cut, "length": length, "why": why, "max_change": float(per_position.max())}
    if not len(leaked):
        return CheckResult("causality", PASS, measured_text, expected, details=details)
    first = int(leaked[0])
    details["first_position"] = first
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
