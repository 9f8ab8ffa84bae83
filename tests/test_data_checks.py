"""The data checks around their thresholds: input-normalization on healthy and broken inputs,
and the parts of leakage (copies between the splits, the one-feature probe, the shared early
score). The planted bugs themselves are in tests/zoo.py; here, the healthy data that must not
raise an alarm and the controls that show each protection is what passes or fails it."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch.nn import functional as F
from torch.utils.data import BatchSampler, DataLoader, RandomSampler, SequentialSampler

import dlci
import zoo
from dlci.checks import overlap, probe, run_checks, select
from dlci.checks import sample as sample_module
from dlci.checks.base import CheckResult, Context
from dlci.checks.labels import _as_columns, _auc, _fit, _scores
from dlci.ladder.tiers import choose_tier
from dlci.training.batching import logits_of

TIER = choose_tier(budget="pr", hardware="cpu")
N = 512


pytestmark = pytest.mark.usefixtures("one_thread")


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _labels(n: int = N, seed: int = 9) -> torch.Tensor:
    return torch.randint(0, zoo.CLASSES, (n,), generator=_gen(seed))


def check(check_id: str, x: torch.Tensor, y: torch.Tensor | None = None, **kw) -> CheckResult:
    """One check on a target over ``x`` (split 80/20 as in the zoo); the model is not run."""
    target = zoo.classification(x_y=(x, _labels(len(x)) if y is None else y), **kw)
    return run_checks(target, checks=select(check_id), tier=TIER)[0]


# --------------------------------------------------------------------- input-normalization


def _sparse_counts() -> torch.Tensor:
    values = torch.rand(N, 50, generator=_gen(1)) * 0.3
    return torch.where(torch.rand(N, 50, generator=_gen(2)) < 0.1, values, torch.zeros(()))


def _flattened_images_with_a_blank_border() -> torch.Tensor:
    x = torch.rand(N, 64, generator=_gen(3))
    x[:, :10] = 0.0  # the border pixels of every image: constant, and healthy
    return x


HEALTHY = {
    "standardised features": lambda: torch.randn(N, 10, generator=_gen()),
    "one-hot features": lambda: F.one_hot(
        torch.randint(0, 10, (N,), generator=_gen(4)), 10
    ).float(),
    "one-hot, categories unseen": lambda: F.one_hot(_labels(seed=4), 10).float(),
    "images in [0, 1]": lambda: torch.rand(N, 3, 8, 8, generator=_gen()),
    "unit-norm embeddings": lambda: F.normalize(torch.randn(N, 768, generator=_gen()), dim=1),
    "sparse counts (tf-idf)": _sparse_counts,
    "flattened images, blank border": _flattened_images_with_a_blank_border,
    "sequences of vectors": lambda: torch.randn(N, 12, 16, generator=_gen()),
}


@pytest.mark.parametrize("name", list(HEALTHY))
def test_healthy_inputs_pass_input_normalization(name: str) -> None:
    result = check("input-normalization", HEALTHY[name]())
    assert result.status == "pass", result


def test_integer_inputs_are_skipped_with_the_reason() -> None:
    tokens = torch.randint(0, 100, (N, 12), generator=_gen())
    result = check("input-normalization", tokens)
    assert result.status == "skip"
    assert result.cause.startswith("the inputs are integers (token IDs or category codes)")


def _scaled(column: int, factor: float) -> torch.Tensor:
    x = torch.randn(N, 10, generator=_gen())
    x[:, column] *= factor
    return x


def _constant(count: int) -> torch.Tensor:
    x = torch.randn(N, 64, generator=_gen())
    x[:, :count] = 0.5
    return x


def _with_nan() -> torch.Tensor:
    x = torch.randn(N, 10, generator=_gen())
    x[3, 2] = float("nan")
    return x


def _dominated() -> torch.Tensor:
    x = torch.randn(N, 10, generator=_gen()) * 0.005
    x[:, 4] = torch.randn(N, generator=_gen(5))
    return x


BROKEN = {
    "8-bit pixels": (
        lambda: torch.randint(0, 256, (N, 3, 8, 8), generator=_gen()).float(),
        "fail",
        "channel 0: rms 1",
    ),
    "one unscaled feature": (
        lambda: _scaled(6, 1000.0),
        "fail",
        "feature 6: rms 960 (mean -95.1, sd 955",
    ),
    "a feature at scale 15": (lambda: _scaled(2, 15.0), "warn", "feature 2: rms 1"),
    "one feature dominating": (
        _dominated,
        "warn",
        "feature 4: rms 0.99, 204x the median feature's 0.00485",
    ),
    "a NaN": (_with_nan, "fail", "1 non-finite values (NaN or inf)"),
    "every feature constant": (lambda: _constant(64), "fail", "every feature is constant"),
    "most features constant": (lambda: _constant(40), "warn", "40 of 64 features are constant"),
}


@pytest.mark.parametrize("name", list(BROKEN))
def test_broken_inputs_are_named_with_their_numbers(name: str) -> None:
    make, status, fragment = BROKEN[name]
    result = check("input-normalization", make())
    assert (result.status, fragment in result.measured) == (status, True), result
    assert result.cause and result.fix


def test_channels_last_images_are_read_per_channel() -> None:
    """Images as a Perceiver takes them, (N, H, W, C): before, 8x8x3 images were read as 8
    channels of 8x3 values, and a held-out split scaled otherwise per channel was judged on
    rows of pixels."""
    from dlci.checks.normalization import _positions

    raw = torch.rand(N, 3, 8, 8, generator=_gen()) * torch.tensor([0.9, 0.5, 0.3])[:, None, None]
    mean, sd = raw.mean(dim=(0, 2, 3), keepdim=True), raw.std(dim=(0, 2, 3), keepdim=True)
    cut = int(N * 0.8)
    x = torch.cat([(raw[:cut] - mean) / sd, raw[cut:]]).permute(0, 2, 3, 1).contiguous()
    result = check("input-normalization", x)
    assert result.status == "fail" and "median over 3 channels" in result.measured, result
    # the control: read channels-first, the same images have 8 "channels"
    assert _positions(x[:2]).shape[-1] == 8 and _positions(x[:2], True).shape[-1] == 3


def test_a_held_out_split_without_the_per_channel_normalisation_fails() -> None:
    raw = torch.rand(N, 3, 8, 8, generator=_gen()) * torch.tensor([0.9, 0.5, 0.3])[:, None, None]
    mean, sd = raw.mean(dim=(0, 2, 3), keepdim=True), raw.std(dim=(0, 2, 3), keepdim=True)
    cut = int(N * 0.8)
    x = torch.cat([(raw[:cut] - mean) / sd, raw[cut:]])  # held-out: only scaled to [0, 1]
    result = check("input-normalization", x)
    assert result.status == "fail"
    assert "median over 3 channels" in result.measured
    assert result.cause.startswith("the held-out split is not normalised like the training")


def _sorted_held_out() -> tuple[torch.Tensor, torch.Tensor]:
    """Classes far apart; the held-out rows are those of two classes only (a split by class
    order), so their means differ from the training means for a healthy reason."""
    y = torch.sort(_labels()).values
    centers = torch.randn(zoo.CLASSES, 10, generator=_gen(6)) * 3
    x = centers[y] + torch.randn(N, 10, generator=_gen(7))
    order = torch.cat(
        [torch.randperm(int(N * 0.8), generator=_gen(8)), torch.arange(int(N * 0.8), N)]
    )
    return x[order], y[order]


def test_a_held_out_split_of_other_classes_is_compared_class_for_class(monkeypatch) -> None:
    from dlci.checks import normalization

    x, y = _sorted_held_out()
    assert check("input-normalization", x, y).status == "pass"
    monkeypatch.setattr(normalization, "_class_weights", lambda ctx, sample: (None, None))
    control = check("input-normalization", x, y)  # without the class weights: a false alarm
    assert control.status != "pass", control


# ------------------------------------------------------------------------------ the sample


def test_the_sample_reads_map_style_data_by_index_across_the_split(monkeypatch) -> None:
    monkeypatch.setitem(sample_module.EXAMPLES, "train", 100)
    x, y = zoo._blobs()
    target = zoo.classification(x_y=(x, y))
    ctx = Context.build(target, device="cpu")
    train = sample_module.data_sample(ctx).train
    assert train is not None and train.by_index and train.total == 409
    assert train.indices[:3] == [0, 4, 8] and train.indices[-1] == 404  # evenly spaced
    assert torch.equal(train.leaves["inputs"][1], x[4])
    assert sample_module.data_sample(ctx) is ctx.shared["data-sample"]  # read once per run


def test_the_sample_is_bounded_in_bytes(monkeypatch) -> None:
    monkeypatch.setitem(sample_module.BYTES, "train", 40 * (64 * 4 + 8))  # 40 examples
    target = zoo.classification(x_y=(torch.rand(N, 64, generator=_gen()), _labels()))
    train = sample_module.data_sample(Context.build(target, device="cpu")).train
    assert train is not None and train.size == 40


def test_a_loader_without_a_data_set_is_read_from_its_first_batches() -> None:
    x, y = torch.randn(96, 10, generator=_gen()), _labels(96)
    batches = [(x[i : i + 32], y[i : i + 32]) for i in range(0, 96, 32)]
    target = dlci.Target(
        zoo.MLP(), lambda p: torch.optim.Adam(p), batches, loss_fn=torch.nn.CrossEntropyLoss()
    )
    train = sample_module.data_sample(Context.build(target, device="cpu")).train
    assert train is not None and not train.by_index
    assert train.where() == "positions in the loader's order" and train.size == 96


def test_variable_length_examples_skip_the_data_checks_with_the_reason() -> None:
    batches = [(torch.randn(16, n), torch.zeros(16, dtype=torch.long)) for n in (5, 7)]
    target = dlci.Target(
        zoo.MLP(),
        lambda p: torch.optim.Adam(p),
        batches,
        loss_fn=F.cross_entropy,
        val_loader=batches,
    )
    result = run_checks(target, checks=select("input-normalization"), tier=TIER)[0]
    assert (result.status, result.cause) == (
        "skip",
        "the examples differ in shape from batch to batch (variable length)",
    )


# ----------------------------------------------------------------- leakage: copies


def test_near_copies_are_found_and_named() -> None:
    train = torch.randn(400, 10, generator=_gen())
    val = torch.cat([train[50:70] + 1e-3, torch.randn(80, 10, generator=_gen(1))])
    found = overlap.find(train, val)
    assert [(r, c, e) for r, c, e in found.pairs[:2]] == [(0, 50, False), (1, 51, False)]
    assert (len(found.pairs), found.within, found.status()) == (20, 0.0, "fail")


def test_wide_inputs_are_compared_through_a_projection() -> None:
    train = torch.rand(300, 3072, generator=_gen())
    val = torch.cat(
        [train[:10] + 1e-3 * torch.randn(10, 3072, generator=_gen(1)), torch.rand(90, 3072)]
    )
    assert len(overlap.find(train, val).pairs) == 10


def test_data_that_repeats_itself_is_not_a_split_overlap() -> None:
    """Five yes/no columns: 32 possible rows, so rows repeat within training and across."""
    rows = torch.randint(0, 2, (500, 5), generator=_gen()).float()
    found = overlap.find(rows[:400], rows[400:])
    assert found.cross == 1.0 and found.within == 1.0
    assert found.status() == "pass"
    control = overlap.Overlap(found.pairs, found.cross, 0.0, found.val_rows, found.train_rows)
    assert control.status() == "fail"  # without the repeat rate: every row a copy


def test_continuous_data_has_no_copies() -> None:
    x, _ = zoo._blobs()
    found = overlap.find(x[:409], x[409:])
    assert (found.pairs, found.status()) == ([], "pass")


def test_leakage_names_the_copied_examples_by_their_data_set_index() -> None:
    factory, _ = zoo.BUGS["held-out rows copied from training"]
    result = run_checks(factory(), checks=select("leakage"), tier=TIER)[0]
    copies = result.details["copies"]
    assert copies["pairs"][:2] == [[0, 100, True], [1, 101, True]]
    assert copies["indices"] == {"held_out": "data-set indices", "training": "data-set indices"}


# ------------------------------------------------------------- leakage: one-feature probe


def test_the_probe_finds_the_leaked_feature_and_passes_real_ones() -> None:
    x, y = zoo._blobs()
    clean = probe.classify(x[:409], y[:409], x[409:], y[409:], zoo.CLASSES)
    assert clean.status() == "pass" and clean.score < 0.4
    leaked = zoo.leaked_feature().train_loader.dataset.tensors[0]
    found = probe.classify(
        leaked[:409],
        y[:409],
        zoo.leaked_feature().val_loader.dataset.tensors[0],
        y[409:],
        zoo.CLASSES,
    )
    assert (found.column, found.status()) == (9, "fail")


def test_the_probe_finds_a_copy_of_a_regression_target() -> None:
    x = torch.randn(N, 8, generator=_gen())
    y = x @ torch.randn(8, generator=_gen(1))
    assert probe.regress(x[:400], y[:400], x[400:], y[400:]).status() == "pass"
    x[:, 5] = torch.exp(y / 3)  # a nonlinear function of the target: the binned probe sees it
    found = probe.regress(x[:400], y[:400], x[400:], y[400:])
    assert found.column == 5 and found.score > 0.9


def test_inputs_too_wide_for_the_probe_say_so() -> None:
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(6400, zoo.CLASSES))
    result = check("leakage", torch.rand(N, 1, 80, 80, generator=_gen()), model=model)
    assert "no one-feature probe: 6400 values per example" in result.measured


# ------------------------------------------------------------- leakage: the shared score


def test_leakage_reuses_label_alignments_copy_and_scores_the_same(monkeypatch) -> None:
    steps = {"count": 0}
    step = Context.step

    def counted(self, *args, **kwargs):
        steps["count"] += 1
        return step(self, *args, **kwargs)

    monkeypatch.setattr(Context, "step", counted)
    alone = run_checks(zoo.clean_classification(), checks=select("leakage"), tier=TIER)[0]
    assert steps["count"] == 20  # the control: on its own, leakage trains its copy
    steps["count"] = 0
    both = run_checks(
        zoo.clean_classification(), checks=select("label-alignment,leakage"), tier=TIER
    )
    assert steps["count"] == 120  # the two arms of label-alignment; leakage trains nothing
    assert both[1].measured == alone.measured


class CountingLoader:
    """A loader that counts how often it is read."""

    def __init__(self, loader: object) -> None:
        self.loader, self.reads = loader, 0

    def __iter__(self):
        self.reads += 1
        return iter(self.loader)

    def __getattr__(self, name: str) -> object:  # its generator, restored after each check
        return getattr(self.loader, name)


def _label_alignment_reads(cache: bool, monkeypatch) -> tuple[int, str]:
    from dlci.checks import base

    if not cache:
        monkeypatch.setattr(base, "CACHE_BYTES", -1)
    target = zoo.clean_classification()
    target.train_loader = CountingLoader(target.train_loader)
    results = run_checks(target, checks=select("lr-range,label-alignment"), tier=TIER)
    return target.train_loader.reads, results[1].measured


def test_the_lr_sweeps_batches_serve_the_checks_after_it(monkeypatch) -> None:
    reads, measured = _label_alignment_reads(True, monkeypatch)
    assert reads == 2  # the first batch (the context), then lr-range's sweep; no more
    control, same = _label_alignment_reads(False, monkeypatch)
    assert control == 3  # label-alignment reads the loader again without the kept batches
    assert same == measured  # the same batches either way


# ------------------------------------------------- the fit of the outputs, the loss's floor


def test_the_auc_reads_only_the_order_of_the_scores() -> None:
    labels = torch.tensor([0.0, 0.0, 1.0, 1.0])
    assert _auc(torch.tensor([-2.0, -1.0, 1.0, 3.0]), labels) == 1.0
    assert _auc(torch.sigmoid(torch.tensor([-2.0, -1.0, 1.0, 3.0])), labels) == 1.0
    assert _auc(torch.tensor([3.0, 1.0, -1.0, -2.0]), labels) == 0.0
    assert _auc(torch.zeros(4), labels) == 0.5  # ties count half
    assert _auc(torch.tensor([0.0, 2.0, 1.0, 3.0]), labels) == 0.75


def test_the_fit_is_r2_for_predictions_and_auc_for_scores_of_0_1_labels() -> None:
    y = torch.randn(200, generator=_gen())
    assert _fit([_as_columns(y.clone(), y)]) == (1.0, "R^2", "")
    assert _fit([_as_columns(torch.full((200, 1), float(y.mean())), y)])[0] == pytest.approx(0)
    labels = (torch.randn(200, 3, generator=_gen(1)) > 0).float()
    assert _fit([_as_columns(10 * labels - 5, labels)]) == (1.0, "AUC", "")
    assert _fit([_as_columns(torch.zeros(200, 3), torch.zeros(200, 3))])[2] == (
        "every held-out label column holds one value only"
    )
    assert _as_columns(torch.zeros(64, 2), torch.zeros(64)) == (
        "the outputs (64, 2) are not one prediction per target value (64,)"
    )
    assert _as_columns(torch.zeros(64, 4), torch.zeros(64, dtype=torch.long)) == (
        "the targets are class indices and num_classes is not given"
    )


def test_the_scores_of_a_model_output_are_its_logits() -> None:
    """As a Transformers ModelOutput (a dict with attributes) holds them."""
    logits = torch.zeros(4, 3)
    assert _scores({"loss": torch.tensor(1.0), "logits": logits}) is logits
    assert _scores(SimpleNamespace(loss=None, logits=logits)) is logits
    assert _scores(logits) is logits
    assert _scores((logits, torch.tensor(0.5))) is logits  # a (logits, loss) tuple
    named = {"hidden": torch.zeros(2, 3), "scores": logits}
    assert logits_of(named, rows=4) is logits  # the first with one row per example
    pair = (torch.zeros(4, dtype=torch.long), "text")
    assert _scores(pair) is pair  # no scores found: the outputs as given


def test_a_loss_that_stays_above_zero_keeps_zero_as_its_floor() -> None:
    """The gain is 1 - true/shuffled, as before, for every loss never seen below zero."""
    results = run_checks(zoo.clean_regression(), checks=select("label-alignment"), tier=TIER)
    details = results[0].details
    assert details["floor"] == 0.0
    assert details["gain"] == pytest.approx(1 - details["true_loss"] / details["shuffled_loss"])


def test_label_alignment_cannot_judge_copies_that_never_trained() -> None:
    """An optimizer factory that ignores the parameters it is given (issue 31): neither copy
    trains, so true and shuffled labels tie; that says nothing of the labels."""
    target = zoo.clean_classification()
    target.optimizer = lambda params: torch.optim.Adam([torch.nn.Parameter(torch.zeros(1))])
    result = run_checks(target, checks=select("label-alignment"), tier=TIER)[0]
    assert result.status == "warn" and result.details["inconclusive"], result
    assert result.cause.startswith("could not judge: the copy trained on the true labels for 60")
    assert result.details["weights_moved"] == 0.0
    # the control: labels that do not belong to their inputs, with a loop that learns, fail
    broken = run_checks(zoo.labels_permuted(), checks=select("label-alignment"), tier=TIER)[0]
    assert broken.status == "fail" and "do not belong to their inputs" in broken.cause


def test_label_alignment_after_a_failed_memorize_says_the_loop_comes_first() -> None:
    """The cascade: a loop that cannot overfit one batch fails memorize; label-alignment then
    does not blame the labels (its control: the same check alone still judges)."""
    results = run_checks(zoo.lr_far_too_low(), checks=select("memorize,label-alignment"), tier=TIER)
    assert [r.status for r in results] == ["fail", "skip"], results
    assert results[1].cause.startswith("could not judge: memorize failed")
    alone = run_checks(zoo.lr_far_too_low(), checks=select("label-alignment"), tier=TIER)[0]
    assert alone.status != "skip" or not alone.cause.startswith("could not judge: memorize")


# --------------------------------------------------------------- shuffle: batch samplers


class Buckets:
    """A batch sampler without a ``sampler``, as bucketing by length builds: batches of
    neighbouring indices, in a shuffled or in the data set's order."""

    def __init__(self, size: int, batch: int, shuffle: bool) -> None:
        self.size, self.batch, self.shuffle = size, batch, shuffle

    def __iter__(self):
        starts = list(range(0, self.size, self.batch))
        if self.shuffle:
            starts = [starts[i] for i in torch.randperm(len(starts), generator=_gen(3))]
        for start in starts:
            yield list(range(start, min(start + self.batch, self.size)))

    def __len__(self) -> int:
        return -(-self.size // self.batch)


def _shuffle_with(batch_sampler) -> CheckResult:
    """The shuffle check on the blobs (in random order) read through ``batch_sampler``."""
    target = zoo.clean_classification()
    target.train_loader = DataLoader(target.train_loader.dataset, batch_sampler=batch_sampler)
    return run_checks(target, checks=select("shuffle"), tier=TIER)[0]


def test_a_loader_given_a_shuffling_batch_sampler_is_shuffled(monkeypatch) -> None:
    """A DataLoader built with a batch_sampler keeps an unused SequentialSampler as its
    ``sampler``: reading it, as before, warned on a Trainer's shuffled loaders."""
    from dlci.checks import data

    dataset = zoo.clean_classification().train_loader.dataset
    sampler = BatchSampler(RandomSampler(dataset, generator=_gen()), 32, drop_last=False)
    assert isinstance(DataLoader(dataset, batch_sampler=sampler).sampler, SequentialSampler)
    assert _shuffle_with(sampler).status == "pass"
    assert _shuffle_with(Buckets(len(dataset), 32, shuffle=True)).status == "pass"
    monkeypatch.setattr(data, "_is_sequential", lambda loader: _old_rule(loader))
    control = _shuffle_with(sampler)
    assert (control.status, control.measured.endswith(", sequential sampler")) == ("warn", True)


def _old_rule(loader) -> bool:
    return isinstance(loader.sampler, SequentialSampler)


def test_a_batch_sampler_in_data_set_order_is_flagged() -> None:
    dataset = zoo.clean_classification().train_loader.dataset
    for batch_sampler in (
        BatchSampler(SequentialSampler(dataset), 32, drop_last=False),
        Buckets(len(dataset), 32, shuffle=False),
    ):
        result = _shuffle_with(batch_sampler)
        assert result.status == "warn", result
        assert result.measured.endswith(", sequential sampler")


class _Residual(torch.nn.Module):
    """A residual denoiser, ``x + net(x)`` with its last layer zeroed: the identity at
    the start, so its reconstruction of held-out inputs is perfect from step 0."""

    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 8)
        )
        torch.nn.init.zeros_(self.net[2].weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.net(x)


def _denoiser() -> dlci.Target:
    torch.manual_seed(0)
    x = torch.randn(N, 8, generator=_gen())
    g = _gen(1)
    return dlci.Target(
        _Residual(),
        lambda p: torch.optim.Adam(p, lr=1e-3),
        DataLoader(list(zip(x[:400], x[:400], strict=True)), 32, shuffle=True, generator=g),
        loss_fn=F.mse_loss,
        val_loader=DataLoader(list(zip(x[400:], x[400:], strict=True)), 64),
    )


def test_targets_that_are_the_inputs_get_no_early_leak_verdict(monkeypatch) -> None:
    from dlci.checks import leakage

    result = run_checks(_denoiser(), checks=select("leakage"), tier=TIER)[0]
    early = result.details["early"]
    assert early["status"] == "skip" and result.status != "fail", result
    assert "the targets are the inputs" in result.measured
    # the control: judged as any target, the identity's perfect early fit reads as a leak
    monkeypatch.setattr(leakage, "_targets_are_inputs", lambda batch: False)
    control = run_checks(_denoiser(), checks=select("leakage"), tier=TIER)[0]
    assert control.status == "fail" and "held-out R^2 0.99" in control.measured, control
