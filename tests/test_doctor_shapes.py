"""The doctor on models of the shapes real projects train (issue 44; tests/real_targets.py):
a VAE whose forward draws noise in eval mode too, a DDPM step that draws timesteps and noise
on every call, a U-Net segmenter with a dice + cross-entropy loss, nanoGPT called as
``model(X, Y)``. Each clean one gets no false failure from the checks these tests own; each
planted bug is caught by the check meant for it; each protection has its control (the bug
missed, or the healthy model failed, without it). One doctor run per case, read by many
assertions."""

from __future__ import annotations

import functools
import time

import pytest

import real_targets
from dlci.checks import CHECK_IDS, run_checks, select
from dlci.checks.base import CheckResult
from dlci.ladder.tiers import choose_tier

TIER = choose_tier(budget="pr", hardware="cpu")
pytestmark = pytest.mark.usefixtures("one_thread")

# what each clean case's full ladder says besides pass (skips say why they cannot run)
CLEAN = {
    "unet": {"train-eval-mode": "skip", "zero-grad": "skip", "causality": "skip"},
    "ddpm": {
        "initial-loss": "skip",  # no num_classes: a regression of noise
        "train-eval-mode": "skip",
        "zero-grad": "skip",
        "causality": "skip",
        "label-alignment": "skip",  # its loss reads no labels from batch[1]
    },
    "nanogpt_pair": {"train-eval-mode": "skip", "zero-grad": "skip", "input-normalization": "skip"},
    "perceiver": {
        "train-eval-mode": "skip",
        "zero-grad": "skip",
        "causality": "skip",
        "activations": "skip",  # softmax attention and LayerNorms only
    },
    # memorize (not these tests' check) fails the healthy VAE: a summed BCE over pixels in
    # (0, 1) flattens at 76% of its start in the tier's epochs; input-dependence and
    # label-alignment then cannot judge. Reported to the memorize gate's owner.
    "vae": {
        "initial-loss": "skip",
        "train-eval-mode": "skip",
        "causality": "skip",
        "memorize": "fail",
        "input-dependence": "skip",
        "label-alignment": "skip",  # no loss_fn: the step scores its inputs itself
    },
}


def _run(name: str, checks: str | None = None, **bug: bool) -> dict[str, CheckResult]:
    factory = functools.partial(getattr(real_targets, name), **bug)
    chosen = None if checks is None else select(checks)
    results = run_checks(factory(), checks=chosen, tier=TIER, factory=factory, device="cpu")
    return {r.id: r for r in results}


@functools.cache
def _clean(name: str) -> dict[str, CheckResult]:
    return _run(name)


@pytest.mark.parametrize("name", list(CLEAN))
def test_clean_code_of_each_shape_gets_no_false_alarm(name: str) -> None:
    results = _clean(name)
    assert list(results) == list(CHECK_IDS)
    alarms = {i: r.status for i, r in results.items() if r.status != "pass"}
    assert alarms == CLEAN[name], {i: results[i].measured or results[i].cause for i in alarms}


def test_random_forwards_pass_batch_independence_on_the_same_draws() -> None:
    for name in ("unet", "ddpm", "nanogpt_pair"):
        result = _clean(name)["batch-independence"]
        assert result.status == "pass" and result.measured == "max difference 0", (name, result)
    vae = _run("vae", "batch-independence")["batch-independence"]
    assert vae.status == "pass", vae


def test_heads_merged_in_the_wrong_batch_order_fail_batch_independence() -> None:
    """perceiver-pytorch's Attention merging '(h b)' where it split '(b h)': invisible at
    batch size 1; the fix names the reshape, not only BatchNorm."""
    result = _run("perceiver", "batch-independence", merge_bug=True)["batch-independence"]
    assert result.status == "fail" and "reshape" in result.fix, result
    assert _clean("perceiver")["batch-independence"].measured == "max difference 0"


def test_control_without_replayed_draws_a_random_forward_gets_no_verdict(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Before: batch-independence compared evaluations on different draws and failed the
    healthy VAE and DDPM as "examples leak into each other". Without the replay, the
    same-batch-twice control sees the draws move the outputs and says it cannot judge."""
    from dlci.training.draws import Draws

    monkeypatch.setattr(Draws, "replay", lambda self: None)
    for name in ("vae", "ddpm"):
        result = _run(name, "batch-independence")["batch-independence"]
        assert result.status == "warn" and result.details["inconclusive"], (name, result)
        assert result.cause.startswith("could not judge: ")


def test_causality_finds_the_token_ids_inside_the_forwards_pair() -> None:
    clean = _clean("nanogpt_pair")["causality"]
    assert "moved by up to 0 " in clean.measured and "shifted by one" in clean.measured, clean
    unmasked = _run("nanogpt_pair", "causality", unmasked=True)["causality"]
    assert unmasked.status == "fail", unmasked
    assert "the first position to change is" in unmasked.measured


def test_a_causality_skip_names_what_the_inputs_hold() -> None:
    cause = _clean("unet")["causality"].cause
    assert "looked inside tuples, dicts and dataclasses" in cause and "(16, 3, 16, 16)" in cause


@functools.cache
def _dependence(name: str, bug: str) -> CheckResult:
    return _run(name, "input-dependence", **({bug: True} if bug else {}))["input-dependence"]


@pytest.mark.parametrize(
    ("name", "bug", "said"),
    [
        ("vae", "mean_reconstruction", "training made the outputs follow the inputs less"),
        ("vae", "input_cut", "do not depend on the inputs at all"),
        ("unet", "input_cut", "do not depend on the inputs at all"),
    ],
)
def test_outputs_that_ignore_the_inputs_fail_input_dependence(
    name: str, bug: str, said: str
) -> None:
    result = _dependence(name, bug)
    assert result.status == "fail" and said in result.cause, result
    # the control: the same code without the bug passes, its outputs following the inputs
    clean = _dependence(name, "")
    assert clean.status == "pass", clean
    assert clean.details["ratio"] > 10 * result.details["ratio"], (clean.details, result.details)


def test_outputs_led_by_the_drawn_noise_are_not_taken_for_a_blind_model() -> None:
    """A diffusion step that returns (noise, prediction): the first tensor, the one read,
    is the noise, the same under the swap on the same draws; the prediction moved, so the
    model is not blind (no "do not depend at all")."""
    result = _dependence("ddpm", "noise_first")
    assert result.status == "pass" and result.details["output_move"] == 0, result


def test_input_dependence_reads_targets_that_are_the_inputs_or_class_maps() -> None:
    assert _dependence("vae", "").details["targets"].startswith("the inputs")
    assert _clean("unet")["input-dependence"].details["targets"].startswith("the class labels")
    assert _clean("ddpm")["input-dependence"].details["targets"].startswith("the inputs")


@functools.cache
def _transposed() -> CheckResult:
    return _run("unet", "label-alignment", transposed=True)["label-alignment"]


def test_a_mask_misaligned_with_its_image_fails_label_alignment() -> None:
    result = _transposed()
    assert result.status == "fail", result
    assert "the targets transposed line up with the inputs better than as given" in (
        result.measured
    )
    layout = result.details["layout"]
    assert layout["changed_loss"] < layout["as_given_loss"]
    # the aligned masks: learned better as given
    clean = _clean("unet")["label-alignment"]
    assert clean.status == "pass" and clean.details["layout"]["gain"] > 0, clean


def test_control_the_shuffled_label_reading_alone_passes_the_misaligned_mask() -> None:
    """The issue's finding: a transposed image still tells a model how much of it is
    object, so the shuffled-label control alone passes it (its reading, kept beside the
    layout control's failure: a gain over the 10% a pass needs)."""
    shuffled = _transposed().details["shuffled_labels"]
    assert shuffled["gain"] >= 0.1, shuffled


def test_a_composite_loss_is_judged_by_its_cross_entropy_part() -> None:
    result = _clean("unet")["initial-loss"]
    assert result.status == "pass", result
    assert "not a plain cross-entropy" in result.measured
    # the control: the composite loss itself is far outside the band around ln 2
    composite = float(result.measured.split(" ")[0])
    assert composite / 0.693 > 2


def _slow_clock(monkeypatch: pytest.MonkeyPatch, factor: float = 100.0) -> None:
    """Every clock the doctor could read runs ``factor`` times fast: a check then sees each
    step take 100 times as long, as on a loaded runner."""
    start = time.perf_counter()
    base = {name: getattr(time, name) for name in ("perf_counter", "monotonic", "time")}
    for name, clock in base.items():
        origin = clock()
        monkeypatch.setattr(
            time, name, lambda clock=clock, origin=origin: origin + factor * (clock() - origin)
        )
    assert time.perf_counter() - start >= 0  # the patched clock runs


def test_the_verdicts_do_not_depend_on_the_machines_speed(monkeypatch: pytest.MonkeyPatch) -> None:
    """label-alignment trains on to 240 steps on the U-Net (no pass at 60): before, it did
    so only when that was projected to take under 30 s, so a loaded machine changed the
    verdict. Under a clock 100x slow the verdicts are the same."""
    idle_unet = _clean("unet")["label-alignment"]
    idle_gpt = _clean("nanogpt_pair")
    _slow_clock(monkeypatch)
    slow_unet = _run("unet", "label-alignment")["label-alignment"]
    assert slow_unet.status == idle_unet.status
    assert slow_unet.details["steps"] == idle_unet.details["steps"] == 240
    # the control: the doctor did read the slowed clock (a check's seconds are 100x)
    assert slow_unet.seconds > 20 * idle_unet.seconds, (slow_unet.seconds, idle_unet)
    # the whole ladder on nanoGPT, but memorize: its gate's time cap (the memorization
    # engine, not these tests' code) stops it early under the slow clock, pass -> warn
    slow = _run("nanogpt_pair")
    mine = [i for i in CHECK_IDS if i != "memorize"]
    assert [slow[i].status for i in mine] == [idle_gpt[i].status for i in mine]


def test_update_ratio_knows_adadelta_sets_its_own_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """pytorch/examples' MNIST loop trains with Adadelta at lr 1.0: its first updates are
    sized by accumulators that start at zero, not by lr x gradient."""
    from dlci.checks import gradients
    from dlci.checks.base import Context, preserved

    target = real_targets.mnist()
    ctx = Context.build(target, batch_size=TIER.batch_size, device="cpu", tier=TIER)
    with preserved(target):
        result = gradients.update_ratio(ctx)
    assert result.status == "pass" and "Adadelta sets its own step size" in result.measured
    # the control: the same measured trajectory judged as if Adadelta stepped by lr x grad
    monkeypatch.setattr(gradients, "ADAPTIVE", ())
    with preserved(target):
        control = gradients.update_ratio(ctx)
    assert control.status == "warn" and control.cause == "updates are large", control


@pytest.mark.parametrize("root", ["batch-independence", "input-dependence"])
def test_label_alignment_is_put_down_to_a_batch_mixing_or_input_blind_model(
    root: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Perceiver whose heads merge back in the wrong batch order fails batch-independence,
    and label-alignment warns beside it: the labels are not to blame."""
    from dlci.checks import cascade

    def results() -> list[CheckResult]:
        return [
            CheckResult(root, "fail", "max difference 0.3", cause="mixes the batch"),
            CheckResult("label-alignment", "warn", "held-out loss", cause="the labels"),
        ]

    ran = results()
    cascade.attribute(ran)
    assert ran[1].follows == [root] and ran[1].cause.startswith(f"may follow from {root}")
    # the control: without the cause in the table, the warning blames the labels alone
    table = {k: tuple(c for c in v if c != root) for k, v in cascade.CAUSES.items()}
    monkeypatch.setattr(cascade, "CAUSES", table)
    ran = results()
    cascade.attribute(ran)
    assert ran[1].follows == [] and ran[1].cause == "the labels"
