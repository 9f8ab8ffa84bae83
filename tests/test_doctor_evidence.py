"""The doctor fails only on evidence (issue 31): a check whose premise did not hold says it
could not judge, a failure that may follow from an earlier one says so and names its root,
every run writes its report, and the blind spots have checks. Each case has its control: the
same check failing where the fault is real."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
import torch
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

import dlci
import zoo
from dlci.checks import CHECK_IDS, probe, run_checks, select
from dlci.checks.base import CheckResult
from dlci.cli import main
from dlci.ladder.tiers import choose_tier
from dlci.report import doctor as report

TIER = choose_tier(budget="pr", hardware="cpu")
TESTS = Path(__file__).parent


pytestmark = pytest.mark.usefixtures("one_thread")


def _one(target: dlci.Target, check: str) -> CheckResult:
    return run_checks(target, checks=select(check), tier=TIER, device="cpu")[0]


def _digits() -> torch.Tensor:
    from sklearn.datasets import load_digits

    return torch.tensor(load_digits().data, dtype=torch.float32) / 16


def autoencoder(*, misaligned: bool = False) -> dlci.Target:
    """A healthy autoencoder of scikit-learn's digits (sigmoid outputs, MSE): after 60 steps
    both copies have learned only the mean image."""
    torch.manual_seed(0)
    x = _digits()
    x = x[torch.randperm(len(x), generator=torch.Generator().manual_seed(0))]
    y = x[torch.randperm(len(x), generator=torch.Generator().manual_seed(1))] if misaligned else x
    cut = int(len(x) * 0.75)
    g = torch.Generator().manual_seed(0)
    train = DataLoader(TensorDataset(x[:cut], y[:cut]), batch_size=32, shuffle=True, generator=g)
    model = torch.nn.Sequential(
        *(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 16), torch.nn.ReLU()),
        *(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.Sigmoid()),
    )
    return dlci.Target(
        model,
        lambda p: torch.optim.Adam(p, lr=1e-3),
        train,
        loss_fn=F.mse_loss,
        val_loader=DataLoader(TensorDataset(x[cut:], y[cut:]), batch_size=64),
    )


# ------------------------------------------------------------ label-alignment's premise


def test_an_autoencoder_that_needs_more_steps_gets_them_and_passes() -> None:
    """Before: 0.0753 vs 0.0756 after 60 steps, a failure blaming the labels. Both copies had
    learned the mean image only; trained on to 240 steps, the true targets pull ahead."""
    result = _one(autoencoder(), "label-alignment")
    assert result.status == "pass", result
    assert result.details["steps"] == 240 and result.details["gain"] > 0.1


def test_targets_that_do_not_belong_fail_the_same_autoencoder_and_permuted_labels() -> None:
    """The controls: the autoencoder with another example's image as its target cannot fit
    its own batches in 240 steps, but its loop fits one batch, so the labels are to blame (a
    failure, not "could not judge"); the zoo's permuted labels, which a copy fits, fail."""
    misaligned = _one(autoencoder(misaligned=True), "label-alignment")
    assert misaligned.status == "fail", misaligned
    assert misaligned.cause.startswith("the loop learns (a copy trained 60 steps on one batch")
    assert " on one batch learns it (loss " in misaligned.details["loop_learns"]
    permuted = _one(zoo.labels_permuted(), "label-alignment")
    assert permuted.status == "fail", permuted
    assert permuted.details["fit"] >= 0.1 and permuted.details["gain"] < 0.02
    assert "fits its own training batches but generalises no better" in permuted.cause


def _labels_in_the_inputs() -> dlci.Target:
    """A step that reads its labels from the inputs' dict, not from batch[1]."""
    x, y = zoo._blobs()

    class Rows(torch.utils.data.Dataset):
        def __init__(self, x, y) -> None:
            self.x, self.y = x, y

        def __len__(self) -> int:
            return len(self.y)

        def __getitem__(self, i):
            return {"x": self.x[i], "y": self.y[i]}, self.y[i]

    class Model(zoo.MLP):
        def forward(self, x, y=None):  # type: ignore[override]
            return super().forward(x)

    def step(model, batch, optimizer):
        model.train()
        optimizer.zero_grad()
        loss = F.cross_entropy(model(**batch[0]), batch[0]["y"])
        loss.backward()
        optimizer.step()
        return loss

    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    return dlci.Target(
        Model(),
        lambda p: torch.optim.Adam(p, lr=3e-3),
        DataLoader(Rows(x[:400], y[:400]), batch_size=32, shuffle=True, generator=g),
        loss_fn=torch.nn.CrossEntropyLoss(),
        val_loader=DataLoader(Rows(x[400:], y[400:]), batch_size=64),
        num_classes=zoo.CLASSES,
        train_step=step,
    )


def test_a_step_that_reads_its_labels_elsewhere_gets_no_verdict_on_batch_1() -> None:
    result = _one(_labels_in_the_inputs(), "label-alignment")
    assert result.status == "warn" and result.details["inconclusive"], result
    assert "does not read its labels from the batch's targets" in result.cause
    # the control: the same model and data with a step that reads batch[1] is judged (a pass)
    assert _one(zoo.clean_classification(), "label-alignment").status == "pass"


# ------------------------------------------------------------------------ the cascade


@functools.cache
def _cascade() -> tuple[CheckResult, ...]:
    ids = "zero-grad,weight-norms,update-ratio,label-alignment"
    return tuple(run_checks(zoo.no_zero_grad_sgd(), checks=select(ids), tier=TIER, device="cpu"))


def test_a_failure_that_follows_from_an_earlier_one_names_its_root() -> None:
    results = {r.id: r for r in _cascade()}
    assert results["zero-grad"].status == "fail" and results["zero-grad"].follows == []
    following = [r for r in _cascade() if r.follows]
    assert {r.id for r in following} >= {"update-ratio", "label-alignment"}, following
    for result in following:
        assert result.follows == ["zero-grad"]
        assert result.cause.startswith("may follow from zero-grad, which also failed: ")
        assert result.fix.startswith("fix zero-grad first")
    data = report.build(list(_cascade()), target="zoo:no_zero_grad_sgd", tier={}, seed=0)
    assert data.roots == ["zero-grad"] and data.counts["following"] == len(following)
    assert data.reason and data.reason.startswith("zero-grad failed")
    assert "may follow from an earlier one" in report._tally(data.counts)


def test_control_alone_the_same_check_blames_the_labels() -> None:
    """Without zero-grad in the run there is no root to name: the check's own cause stands
    (the warning the cascade explains is real, and would otherwise read as a label fault)."""
    alone = _one(zoo.no_zero_grad_sgd(), "label-alignment")
    assert alone.status in ("warn", "fail") and alone.follows == []
    assert "labels do not belong" in alone.cause


def test_a_root_that_runs_later_is_named_too() -> None:
    """initial-loss runs before loss-broadcast, but a broadcast loss distorts it."""
    from dlci.checks.cascade import attribute

    results = [
        CheckResult("initial-loss", "fail", cause="c"),
        CheckResult("loss-broadcast", "fail"),
    ]
    attribute(results)
    assert results[0].follows == ["loss-broadcast"] and results[1].follows == []


# ------------------------------------------------------------------ always a report


def test_a_loader_that_raises_still_gets_a_report_for_every_check(monkeypatch, tmp_path) -> None:
    monkeypatch.chdir(TESTS)
    assert main(["doctor", "--target", "zoo:loader_raises", "--out", str(tmp_path)]) == 1
    data = json.loads((tmp_path / "doctor.json").read_text())
    assert [c["id"] for c in data["checks"]] == list(CHECK_IDS)
    first, *rest = data["checks"]
    assert first["status"] == "fail" and "expected sequence of length 5" in first["measured"]
    assert first["cause"].startswith("the target gave no batch to check")
    assert {c["status"] for c in rest} == {"skip"}
    assert all("see optimizer-coverage" in c["cause"] for c in rest)
    assert data["verdict"] == "fail" and data["reason"] == "optimizer-coverage failed"


# ------------------------------------------------------------------ num_classes by hand


def test_a_hand_given_num_classes_the_outputs_contradict_is_judged_by_the_outputs() -> None:
    """num_classes=10 for a head of 4: before, initial-loss read 'below chance' and shuffle
    expected 10 classes per batch and failed."""
    target = zoo.classification()
    target.num_classes = 10
    results = {
        r.id: r for r in run_checks(target, checks=select("initial-loss,shuffle"), tier=TIER)
    }
    assert [r.status for r in results.values()] == ["pass", "pass"], results
    assert (
        "num_classes=10 is given, but the outputs score 4 classes"
        in results["initial-loss"].measured
    )
    # the control: data that really is sorted still fails shuffle with the same hand-given 10
    sorted_ = zoo.sorted_by_class()
    sorted_.num_classes = 10
    assert _one(sorted_, "shuffle").status == "fail"


# ---------------------------------------------------------------- the group probe


def test_the_group_probe_finds_a_one_hot_label_and_nothing_in_real_digits() -> None:
    from sklearn.datasets import load_digits

    digits = load_digits()
    x, y = torch.tensor(digits.data, dtype=torch.float32), torch.tensor(digits.target)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))
    x, y = x[order], y[order]
    cut = 1200
    assert probe.group(x[:cut], y[:cut], x[cut:], y[cut:], 10) is None
    leaked = torch.cat([x, F.one_hot(y, 10).float()], 1)
    found = probe.group(leaked[:cut], y[:cut], leaked[cut:], y[cut:], 10)
    assert found is not None and sorted(found.columns) == list(range(64, 74))
    assert found.score > 0.99
    single = probe.classify(leaked[:cut], y[:cut], leaked[cut:], y[cut:], 10)
    assert single.score < 0.5  # the one-feature probe alone would not warn


# ------------------------------------------- what real code showed (the review's cases)


def test_a_time_major_batch_is_refused_before_any_check_cuts_it() -> None:
    """pytorch/examples' word language model batches (L, N) inputs with (L * N,) targets:
    before, leakage crashed and the other checks blamed the user's loss for dl-ci's cut."""
    from dlci.errors import DlciError
    from dlci.training.batching import take_batch

    batch = (torch.zeros(16, 8, dtype=torch.long), torch.zeros(128, dtype=torch.long))
    with pytest.raises(DlciError, match=r"differ in their first dimension \(inputs \(16, 8\)"):
        take_batch([batch], 16)
    assert take_batch([(batch[0].t(), batch[1].view(16, 8).t())], 4)[1] == 4  # examples first


class _OwnLoss(torch.nn.Module):
    """As nanoGPT's GPT: forward(idx, targets=None) returns (logits, loss), the logits of the
    last position only without targets; the loss is computed inside."""

    def __init__(self, causal: bool = True) -> None:
        super().__init__()
        import healthy_zoo

        self.lm = healthy_zoo.CausalLM(causal=causal)

    def forward(self, tokens, targets=None):
        logits, _ = self.lm(tokens)
        if targets is None:
            return logits[:, [-1]], None
        return logits, F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def _own_loss(causal: bool = True, shifted: bool = True) -> dlci.Target:
    import healthy_zoo

    target = healthy_zoo.causal_lm()
    if not shifted:  # the labels are the inputs themselves
        data = target.train_loader.dataset.tensors[0]
        g = torch.Generator().manual_seed(0)
        target.train_loader = DataLoader(
            TensorDataset(data, data), batch_size=32, shuffle=True, generator=g
        )
    target.model = _OwnLoss(causal)

    def step(model, batch, optimizer):
        optimizer.zero_grad(set_to_none=True)
        _, loss = model(*batch)
        loss.backward()
        optimizer.step()
        return loss

    target.train_step = step
    target.eval_step = lambda model, batch: model(*batch)
    target.loss_fn = lambda outputs, targets: outputs[1]
    return target


@functools.cache
def _causality(name: str) -> CheckResult:
    import healthy_zoo

    targets = {
        "own loss": lambda: _own_loss(),
        "own loss, no mask": lambda: _own_loss(causal=False),
        "labels not shifted": lambda: healthy_zoo.causal_lm_unshifted(),
        "-inf logits": lambda: healthy_zoo.causal_lm(masked=True),
        "-inf logits, no mask": lambda: healthy_zoo.causal_lm(causal=False, masked=True),
    }
    return _one(targets[name](), "causality")


def test_causality_reads_a_model_through_its_eval_step() -> None:
    """nanoGPT's forward gives every position's logits only with targets: before, the check
    skipped ("no per-position scores") and a removed mask passed every check."""
    assert _causality("own loss").status == "pass", _causality("own loss")
    leaky = _causality("own loss, no mask")
    assert leaky.status == "fail" and "the first position to change is 0" in leaky.measured


def test_logits_masked_to_minus_infinity_are_no_change_and_no_cover() -> None:
    """Before: a healthy model failed batch-independence with "max difference nan", and a
    model without its mask passed causality ("moved by up to nan")."""
    import healthy_zoo

    assert _causality("-inf logits").status == "pass", _causality("-inf logits")
    assert _causality("-inf logits, no mask").status == "fail"
    independent = _one(healthy_zoo.causal_lm(masked=True), "batch-independence")
    assert independent.status == "pass" and independent.measured == "max difference 0"


def test_labels_that_are_the_inputs_themselves_are_caught_by_the_loss() -> None:
    result = _causality("labels not shifted")
    assert result.status == "fail" and "the labels are not shifted" in result.cause
    # the control: the same model with next-token targets passes (its copy loss is high)
    import healthy_zoo

    assert _one(healthy_zoo.causal_lm(), "causality").status == "pass"


class _Stateful(torch.nn.Module):
    """Carries a state from one call to the next, as a stateful RNN language model does."""

    def __init__(self) -> None:
        super().__init__()
        import healthy_zoo

        self.lm = healthy_zoo.CausalLM()
        self.state = torch.zeros(1)

    def forward(self, tokens):
        logits, _ = self.lm(tokens)
        self.state = self.state + 1
        return logits + self.state, None


def test_a_model_with_state_across_calls_gets_no_verdict_on_causality() -> None:
    import healthy_zoo

    target = healthy_zoo.causal_lm()
    target.model = _Stateful()
    result = _one(target, "causality")
    assert result.status == "warn" and result.details["inconclusive"], result
    assert "change from call to call for the same inputs" in result.cause


def test_logits_beside_features_are_found_by_num_classes() -> None:
    """(features (N, 64), logits (N, 4)) outputs: before, the 64 features were taken for the
    scores and initial-loss said "num_classes=4 is given, but the outputs score 64"."""

    class FeaturesFirst(zoo.MLP):
        def forward(self, x):  # type: ignore[override]
            return torch.zeros(x.shape[0], 64) + x.sum(1, keepdim=True), super().forward(x)

    target = zoo.classification(model=FeaturesFirst())
    target.loss_fn = lambda outputs, y: F.cross_entropy(outputs[1], y)
    result = _one(target, "initial-loss")
    assert result.status == "pass" and "outputs score" not in result.measured, result


def test_a_rate_far_off_is_the_root_of_memorize_not_its_consequence() -> None:
    ids = "memorize,lr-range"
    results = {r.id: r for r in run_checks(zoo.lr_far_too_low(), checks=select(ids), tier=TIER)}
    assert results["lr-range"].status == "fail" and results["lr-range"].follows == []
    assert results["memorize"].follows == ["lr-range"], results["memorize"]


class _ConvLM(torch.nn.Module):
    """A next-token model of one convolution over the sequence: causal (padded on the left) or
    seeing one token ahead (padded on both sides); its scores returned per position, or
    flattened to one row per token, batch-first or time-major (as RNN language models do)."""

    def __init__(self, *, leak: bool, layout: str) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(8, 8)
        self.conv = torch.nn.Conv1d(8, 8, 3)
        self.head = torch.nn.Linear(8, 8)
        self.leak, self.layout = leak, layout

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens).transpose(1, 2)
        x = F.pad(x, (1, 1) if self.leak else (2, 0))
        scores = self.head(self.conv(x).transpose(1, 2))  # (N, L, V)
        if self.layout == "batch-first":
            return scores.reshape(-1, 8)
        if self.layout == "time-major":
            return scores.transpose(0, 1).reshape(-1, 8)
        return scores.reshape(-1, 8)[torch.randperm(scores.shape[0] * scores.shape[1])]


def _flattened(leak: bool, layout: str) -> CheckResult:
    torch.manual_seed(0)
    tokens = torch.randint(0, 8, (32, 9))
    pairs = TensorDataset(tokens[:, :-1], tokens[:, 1:])
    model = _ConvLM(leak=leak, layout=layout)
    target = dlci.Target(
        model,
        lambda params: torch.optim.SGD(params, lr=0.1),
        DataLoader(pairs, 16),
        val_loader=DataLoader(pairs, 16),
        loss_fn=lambda out, y: F.cross_entropy(out, y.reshape(-1)),
    )
    return _one(target, "causality")


@pytest.mark.parametrize("layout", ["batch-first", "time-major"])
def test_outputs_flattened_to_one_row_per_token_are_read_in_their_order(layout: str) -> None:
    assert _flattened(leak=False, layout=layout).status == "pass"
    seeing = _flattened(leak=True, layout=layout)  # the control: one token ahead is seen
    assert seeing.status == "fail" and "the first position to change is" in seeing.measured


def test_rows_in_no_order_dl_ci_can_tell_give_no_verdict_on_causality() -> None:
    result = _flattened(leak=True, layout="shuffled")
    assert result.status == "skip" and "cannot be told" in result.cause, result
