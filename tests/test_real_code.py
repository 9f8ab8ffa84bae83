"""dl-ci on real public training code, as its authors wrote it (tests/data/code/README.md):
nanoGPT's GPT (karpathy/nanoGPT, model.py unchanged), wrapped as docs/target.md shows, on
synthetic next-token data. The whole ladder raises no false alarm on it, and each planted
bug of the kind such code really has is caught by the check for it."""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import pytest
import torch
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

import dlci
from dlci.checks import CHECK_IDS, run_checks, select
from dlci.checks.base import CheckResult
from dlci.ladder.tiers import choose_tier

sys.path.insert(0, str(Path(__file__).parent / "data" / "code" / "nanogpt"))
import nanogpt_model as nanogpt

TIER = choose_tier(budget="pr", hardware="cpu")
VOCAB, LENGTH = 32, 16


pytestmark = pytest.mark.usefixtures("one_thread")


def _tokens(n: int, seed: int) -> torch.Tensor:
    """A Markov chain of two successors per token (the same chain for both splits)."""
    successors = torch.randint(0, VOCAB, (VOCAB, 2), generator=torch.Generator().manual_seed(9))
    g = torch.Generator().manual_seed(seed)
    tokens = torch.empty(n, LENGTH + 1, dtype=torch.long)
    tokens[:, 0] = torch.randint(0, VOCAB, (n,), generator=g)
    for i in range(1, LENGTH + 1):
        tokens[:, i] = successors[tokens[:, i - 1], torch.randint(0, 2, (n,), generator=g)]
    return tokens


def optimizer(params, weight_decay=0.1, lr=1e-3, betas=(0.9, 0.95)):
    """GPT.configure_optimizers' two groups, over the parameters dl-ci passes."""
    params = [p for p in params if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=lr, betas=betas)


def step(model, batch, opt, *, zero_grad: bool = True):
    x, y = batch
    model.train()
    _, loss = model(x, y)
    if zero_grad:
        opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return loss


def evaluate(model, batch):
    model.eval()  # the doctor's train-eval-mode check caught this line missing
    return model(*batch)  # every position's logits, and the loss


def make_target(*, causal: bool = True, shifted: bool = True, zero_grad: bool = True):
    torch.manual_seed(0)
    config = nanogpt.GPTConfig(
        block_size=LENGTH, vocab_size=VOCAB, n_layer=2, n_head=2, n_embd=32, dropout=0.0
    )
    model = nanogpt.GPT(config)
    if not causal:  # the planted bug: attention that sees the whole sequence (a mask of ones)
        for block in model.transformer.h:
            block.attn.flash = False
            block.attn.register_buffer("bias", torch.ones(1, 1, LENGTH, LENGTH))

    def split(tokens):
        return (tokens[:, :-1], tokens[:, 1:]) if shifted else (tokens[:, :-1], tokens[:, :-1])

    g = torch.Generator().manual_seed(0)
    train = DataLoader(TensorDataset(*split(_tokens(512, 1))), 16, shuffle=True, generator=g)
    val = DataLoader(TensorDataset(*split(_tokens(128, 2))), 16)
    return dlci.Target(
        model,
        optimizer,
        train,
        val_loader=val,
        train_step=functools.partial(step, zero_grad=zero_grad),
        eval_step=evaluate,
        loss_fn=lambda outputs, targets: F.cross_entropy(
            outputs[0].flatten(0, 1), targets.flatten()
        ),
        num_classes=VOCAB,
    )


@functools.cache
def _ladder(bug: str = "") -> dict[str, CheckResult]:
    planted = {
        "": {},
        "no causal mask": {"causal": False},
        "labels not shifted": {"shifted": False},
        "no zero_grad": {"zero_grad": False},
    }[bug]
    factory = functools.partial(make_target, **planted)
    checks = None if not bug else select({"no causal mask": "causality", "labels not shifted":
                                          "causality", "no zero_grad": "zero-grad"}[bug])  # fmt: skip
    results = run_checks(factory(), checks=checks, tier=TIER, factory=factory, device="cpu")
    return {r.id: r for r in results}


def test_nanogpt_as_written_raises_no_false_alarm() -> None:
    results = _ladder()
    assert list(results) == list(CHECK_IDS)
    alarms = {i: (r.status, r.measured, r.cause) for i, r in results.items() if r.status != "pass"}
    skipped = {i for i, (status, _, _) in alarms.items() if status == "skip"}
    assert set(alarms) == skipped == {"input-normalization"}, alarms  # integer token IDs
    assert "is a causal" not in results["causality"].measured  # judged from its targets
    assert "shifted by one" in results["causality"].measured


@pytest.mark.parametrize(
    ("bug", "check", "said"),
    [
        ("no causal mask", "causality", "the first position to change is"),
        ("labels not shifted", "causality", "outputs that copy each input token score"),
        ("no zero_grad", "zero-grad", "tensors start with last call's gradient"),
    ],
)
def test_a_bug_planted_in_nanogpt_is_caught_by_its_check(bug: str, check: str, said: str) -> None:
    result = _ladder(bug)[check]
    assert result.status == "fail" and said in result.measured, result
