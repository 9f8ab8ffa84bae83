"""The debugging ladder against the healthy zoo (tests/healthy_zoo.py): every check on every
model, and no failure and no warning; the controls show the test would see a false alarm,
and that the checks still catch real bugs planted in the same models."""

from __future__ import annotations

import functools
import math

import pytest
import torch

import healthy_zoo
from dlci.checks import CHECK_IDS, gradients, run_checks, select, trajectory
from dlci.checks.base import CheckResult, Context
from dlci.checks.lr import _diverged
from dlci.checks.repro import _difference
from dlci.checks.units import MAX_ELEMENTS, Site, _bounds, _sample, canonical, measure
from dlci.ladder.tiers import choose_tier

TIER = choose_tier(budget="pr", hardware="cpu")
MODELS = list(healthy_zoo.HEALTHY)

# what activations must see in each model: the kinds of its nonlinearities
KINDS = {
    "CNN, BatchNorm, functional ReLU": {"relu"},
    "ResNet, zero-init last BN gamma": {"relu"},
    "Transformer, zero pos-embedding, GELU": {"gelu"},
    "causal LM, (logits, None) outputs": {"gelu"},
    "ReZero branches, zero-init head, SiLU": {"silu"},
    "multi-label, BCEWithLogits, SiLU": {"silu"},
    "regression, SGD + Nesterov, Mish": {"mish", "softplus"},
    "regression, Gaussian NLL below zero": {"silu"},
    "frozen backbone": {"relu", "gelu"},
    "clipping + OneCycleLR, leaky ReLU, tanh": {"leaky_relu", "tanh"},
    "bf16 autocast on the CPU, GELU": {"gelu"},
}


pytestmark = pytest.mark.usefixtures("one_thread")


@functools.cache
def _results(name: str) -> tuple[CheckResult, ...]:
    """Every check of the ladder on one healthy model, run once and shared by the tests."""
    factory = healthy_zoo.HEALTHY[name]
    return tuple(run_checks(factory(), tier=TIER, factory=factory, device="cpu"))


def _alarms(results: tuple[CheckResult, ...] | list[CheckResult]) -> list[tuple[str, ...]]:
    return [(r.id, r.status, r.measured, r.cause) for r in results if r.status in ("fail", "warn")]


def _run(target, ids: str) -> dict[str, CheckResult]:
    return {r.id: r for r in run_checks(target, checks=select(ids), tier=TIER, device="cpu")}


@pytest.mark.parametrize("name", MODELS)
def test_no_check_fails_or_warns_on_a_healthy_model(name: str) -> None:
    results = _results(name)
    assert [r.id for r in results] == list(CHECK_IDS)
    assert _alarms(results) == []
    for r in results:
        assert r.status == "pass" or (r.status == "skip" and r.cause), r


def test_the_false_alarm_table(capsys) -> None:
    """The table for the closing note: fails, warnings and skips per model (run with -s)."""
    rows = ["| model | fails | warnings | skips (check: why) |", "|---|---|---|---|"]
    for name in MODELS:
        results = _results(name)
        count = {s: sum(r.status == s for r in results) for s in ("fail", "warn", "skip")}
        skips = "; ".join(f"{r.id}: {r.cause}" for r in results if r.status == "skip")
        rows.append(f"| {name} | {count['fail']} | {count['warn']} | {count['skip']}: {skips} |")
        assert count["fail"] == count["warn"] == 0
    with capsys.disabled():
        print("\n" + "\n".join(rows))


@pytest.mark.parametrize("name", list(KINDS))
def test_activations_sees_functional_calls_and_modern_activations(name: str) -> None:
    result = next(r for r in _results(name) if r.id == "activations")
    assert result.status == "pass", result
    seen = {d["kind"] for key, d in result.details.items() if key != "not_shown"}
    assert seen == KINDS[name]


def test_activations_skip_says_why_a_fused_lstm_cannot_be_seen() -> None:
    result = next(r for r in _results("LSTM classifier") if r.id == "activations")
    assert result.status == "skip"
    assert "the gates of LSTM run inside one fused kernel" in result.cause
    assert "F.relu, nn.GELU, torch.tanh" in result.fix


# ----------------------------------------------------------------------------- controls


def test_control_the_old_zero_norm_rule_raises_the_alarm_the_test_catches(monkeypatch) -> None:
    """Judging a zero-initialised tensor against its own (zero) norm, as before: the
    positional embedding 'grows without bound' and its update is 'far too large'."""
    monkeypatch.setattr(trajectory, "typical_rms", lambda weights: 1e-12)
    results = _run(healthy_zoo.transformer_zero_positions(), "weight-norms,update-ratio")
    assert [a[:2] for a in _alarms(list(results.values()))] == [
        ("weight-norms", "fail"),
        ("update-ratio", "fail"),
    ]
    assert results["update-ratio"].measured.startswith("position: ")


def test_control_one_step_of_gradients_fails_a_zero_gamma_resnet(monkeypatch) -> None:
    monkeypatch.setattr(gradients, "FLOW_STEPS", 1)
    result = _run(healthy_zoo.resnet_zero_init_gamma(), "grad-flow")["grad-flow"]
    assert result.status == "fail"
    assert result.measured.startswith("no gradient reaches blocks.0.bn1")


def test_a_zero_gamma_resnet_passes_with_the_late_gradients_named() -> None:
    result = next(r for r in _results("ResNet, zero-init last BN gamma") if r.id == "grad-flow")
    assert result.measured.endswith("; 8 got their first gradient at step 2")
    assert result.details["first_gradient_at_a_later_step"]["blocks.0.conv2.weight"] == 2


def test_a_far_too_high_rate_still_fails_on_zero_initialised_tensors() -> None:
    target = healthy_zoo.transformer_zero_positions()
    target.optimizer = lambda p: torch.optim.Adam(p, lr=10.0)
    result = _run(target, "update-ratio")["update-ratio"]
    assert result.status == "fail"
    assert result.cause.endswith("the learning rate is far too high")
    target = healthy_zoo.rezero_zero_head()
    target.optimizer = lambda p: torch.optim.Adam(p, lr=10.0)
    result = _run(target, "update-ratio")["update-ratio"]
    assert result.status == "fail" and "starts near zero" in result.measured


def test_non_finite_is_reported_only_for_non_finite_weights() -> None:
    target = healthy_zoo.transformer_zero_positions()
    with torch.no_grad():
        target.model.head.weight[0, 0] = math.nan
    results = _run(target, "weight-norms,update-ratio")
    for check in ("weight-norms", "update-ratio"):
        assert results[check].status == "fail"
        assert results[check].measured == "non-finite weights before the first step: head"
    healthy = {r.id: r for r in _results("Transformer, zero pos-embedding, GELU")}
    assert "non-finite" not in healthy["weight-norms"].measured


def test_a_model_whose_every_weight_starts_at_zero_is_held_to_lecun_scale() -> None:
    target = healthy_zoo.cnn_batchnorm_functional()
    model = torch.nn.Linear(64, healthy_zoo.CLASSES)
    torch.nn.init.zeros_(model.weight)
    target.model = torch.nn.Sequential(torch.nn.Flatten(), model)
    results = _run(target, "weight-norms,update-ratio")
    assert [r.status for r in results.values()] == ["pass", "pass"]
    assert results["weight-norms"].details["zero_initialised"] == {"1.weight": "0.125"}


def test_dead_functional_relus_fail() -> None:
    target = healthy_zoo.cnn_batchnorm_functional()
    with torch.no_grad():
        target.model.bn2.bias.fill_(-20.0)  # every unit after the second block below zero
    result = _run(target, "activations")["activations"]
    assert (result.status, result.measured) == ("fail", "FunctionalCNN relu() #2: 100% dead")


def test_gelu_units_far_below_zero_are_dead() -> None:
    target = healthy_zoo.bf16_autocast_cpu()
    with torch.no_grad():
        target.model.first.bias.fill_(-20.0)
    result = _run(target, "activations")["activations"]
    assert (result.status, result.measured) == ("fail", "GeluMLP gelu(): 100% dead")


def test_saturated_tanh_fails() -> None:
    target = healthy_zoo.clipping_onecycle()
    with torch.no_grad():
        target.model.second.weight.mul_(100.0)
    result = _run(target, "activations")["activations"]
    assert result.status == "fail"
    assert result.measured.startswith("LeakyMLP tanh(): ") and result.measured.endswith("saturated")


def test_activation_rules_read_their_arguments() -> None:
    assert [canonical(f) for f in (torch.relu_, torch.Tensor.sigmoid, torch.matmul)] == [
        "relu",
        "sigmoid",
        None,
    ]
    assert _bounds("hardtanh", (None,), {"min_val": 0.0, "max_val": 6.0}) == (0.0, (None, 6.0))
    assert _bounds("hardtanh", (None, -2.0, 2.0), {}) == (None, (-2.0, 2.0))
    assert _bounds("softplus", (None,), {"beta": 2.0}) == (-2.5, None)
    assert _bounds("leaky_relu", (None, 0.01), {}) == (None, None)


def test_a_sequence_unit_dead_on_the_last_axis_counts() -> None:
    """(N, L, D): feature 0 negative everywhere is a dead unit on the last axis."""
    x = torch.randn(16, 12, 8).abs()
    x[..., 0] = -1.0
    site = Site("s", "relu")
    measure(site, x, "relu", (x,), {})
    assert site.dead_share() == 1 / 8


def test_large_tensors_are_sampled_to_a_bounded_size() -> None:
    assert _sample(torch.zeros(4, 64, 128, 128)).numel() <= MAX_ELEMENTS
    assert _sample(torch.zeros(2, 3 * MAX_ELEMENTS)).shape == (1, 3 * MAX_ELEMENTS)  # one example


def test_the_lr_sweep_judges_divergence_of_negative_and_zero_losses() -> None:
    assert _diverged(2.1, 0.5, 2.3) and not _diverged(1.9, 0.5, 2.3)  # 4x the best, as before
    assert not _diverged(-1.9, -2.0, 1.0)  # a Gaussian NLL below zero: not "4x" of -2
    assert _diverged(4.5, -2.0, 1.0)
    assert not _diverged(1.0, 0.0, 0.7) and _diverged(2.2, 0.0, 0.7)  # a hinge loss at zero


def test_the_doctor_leaves_a_batch_samplers_own_generator_as_it_found_it() -> None:
    from torch.utils.data import BatchSampler, DataLoader, RandomSampler

    target = healthy_zoo.regression_gaussian_nll()
    data = target.train_loader.dataset
    generator = torch.Generator().manual_seed(0)
    sampler = BatchSampler(RandomSampler(data, generator=generator), 32, drop_last=False)
    target.train_loader = DataLoader(data, batch_sampler=sampler)
    before = generator.get_state().clone()
    run_checks(target, checks=select("shuffle,label-alignment"), tier=TIER)
    assert torch.equal(before, generator.get_state())


def test_reproducibility_never_calls_nan_equal_to_a_number() -> None:
    nan = math.nan
    assert _difference(torch.tensor([1.0, nan]), torch.tensor([1.0, nan])) == 0.0
    assert _difference(torch.tensor([1.0, nan]), torch.tensor([1.0, 2.0])) == math.inf
    assert _difference(torch.tensor([math.inf]), torch.tensor([math.inf])) == 0.0


# ------------------------------------------------- losses below zero, outputs that are scores

GAUSSIAN = "regression, Gaussian NLL below zero"


def _result(name: str, check: str) -> CheckResult:
    return next(r for r in _results(name) if r.id == check)


def _held_out_targets(target) -> torch.Tensor:
    return torch.cat([batch[1] for batch in target.val_loader])


def test_control_the_old_definitions_fail_a_gaussian_nll_model() -> None:
    """Before: label-alignment's gain was 1 - true/shuffled (0 when shuffled <= 0), and
    leakage called a held-out loss under 1% of the targets' variance near perfect: both fail
    a healthy model whose loss goes below zero. Now both pass, on the same measurements."""
    alignment, leakage = _result(GAUSSIAN, "label-alignment"), _result(GAUSSIAN, "leakage")
    assert (alignment.status, leakage.status) == ("pass", "pass")
    true, shuffled = alignment.details["true_loss"], alignment.details["shuffled_loss"]
    assert true < shuffled < 0  # the true labels do help: the loss is lower
    old_gain = 1 - true / shuffled if shuffled > 0 else 0.0
    assert old_gain < 0.02  # the old rule: fail, "labels do not belong to their inputs"
    assert alignment.details["gain"] >= 0.1
    assert alignment.measured.endswith(
        "the loss goes below zero: floor taken at the lowest seen, -1.1"
    )
    early = leakage.details["early"]
    variance = float(_held_out_targets(healthy_zoo.regression_gaussian_nll()).var())
    assert early["loss"] / variance < 0.01  # the old rule: fail, "near perfect"
    assert early["status"] == "skip"
    assert "no early score: the outputs (64, 2) are not one prediction per target value (64,)" in (
        leakage.measured
    )


def test_a_label_permutation_on_the_gaussian_nll_model_is_still_caught() -> None:
    target = healthy_zoo.regression_gaussian_nll(permute=True)
    result = _run(target, "label-alignment")["label-alignment"]
    assert result.status == "fail", result
    assert result.details["gain"] < 0.02 and result.details["floor"] < 0


def test_multi_label_leakage_reads_the_auc_of_the_outputs() -> None:
    """Before: 'held-out loss 229.53% of the targets' variance' (BCE over the variance of
    0/1 labels). Now the AUC of the logits; the labels planted in the inputs fail it."""
    early = _result("multi-label, BCEWithLogits, SiLU", "leakage").details["early"]
    assert early["fit_name"] == "AUC" and 0.6 < early["fit"] < 0.99
    assert early["loss"] / float(_held_out_targets(healthy_zoo.multilabel_bce()).var()) > 1
    leaked = _run(healthy_zoo.multilabel_bce(leak=True), "leakage")["leakage"]
    assert leaked.status == "fail" and leaked.details["early"]["fit"] >= 0.99
    assert "held-out AUC 0.999 after 20 steps" in leaked.measured


def test_a_squared_error_regression_is_judged_by_r2_as_by_the_old_ratio() -> None:
    """For a mean squared error, R^2 is 1 - loss / variance: the old rule, where it held."""
    early = _result("regression, SGD + Nesterov, Mish", "leakage").details["early"]
    targets = _held_out_targets(healthy_zoo.regression_sgd_momentum())
    assert early["fit_name"] == "R^2"
    assert early["fit"] == pytest.approx(
        1 - early["loss"] / float(targets.var(correction=0)), abs=1e-5
    )


def test_context_is_what_the_checks_share() -> None:
    """The trajectory is computed once per context, for weight-norms and update-ratio."""
    target = healthy_zoo.multilabel_bce()
    ctx = Context.build(target, batch_size=16, device="cpu")
    assert trajectory.trajectory(ctx) is trajectory.trajectory(ctx)
