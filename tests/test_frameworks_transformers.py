"""``dlci.Target.from_transformers`` with real Transformers: a model whose forward returns the
loss, and a Trainer whose optimizer, collator, loaders and compute_loss are reused (the same
weights as ``Trainer.train()`` after the same steps); every gate runs through both."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import pytest
import torch
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    DataCollatorWithPadding,
    GPT2Config,
    GPT2LMHeadModel,
    Trainer,
    TrainingArguments,
)

import dlci
from dlci.checks import run_checks, select
from dlci.cli import main
from dlci.errors import DlciError
from dlci.ladder.tiers import choose_tier
from dlci.memorization.engine import MemorizeConfig, memorize
from dlci.training.text_batches import GroupedBatches

TIER = choose_tier(budget="pr", hardware="cpu")
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "transformers"
CONFIG = MemorizeConfig(max_epochs=300, max_loss=0.3, time_cap_s=120)
sys.path.insert(0, str(EXAMPLE))  # the example's tokenizer and synthetic text

from transformers_example.text import encoded, tokenizer  # noqa: E402


def bert(dropout: float = 0.1, labels: int = 4) -> BertForSequenceClassification:
    config = BertConfig(
        vocab_size=len(tokenizer()),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=32,
        num_labels=labels,
        hidden_dropout_prob=dropout,
        attention_probs_dropout_prob=dropout,
    )
    return BertForSequenceClassification(config)


def trainer(model, tmp_path: Path, examples: int = 64, **args) -> Trainer:
    arguments = TrainingArguments(
        output_dir=str(tmp_path),
        learning_rate=1e-3,
        per_device_train_batch_size=16,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
        **args,
    )
    return Trainer(
        model=model,
        args=arguments,
        train_dataset=encoded(examples, seed=0),
        data_collator=DataCollatorWithPadding(tokenizer()),
    )


def test_a_model_memorizes_through_the_adapter() -> None:
    torch.manual_seed(0)
    built = dlci.Target.from_transformers(
        bert(),
        encoded(64, seed=0),
        data_collator=DataCollatorWithPadding(tokenizer()),
        optimizer=lambda params: torch.optim.AdamW(params, lr=1e-3),
    )
    assert built.num_classes == 4
    result = memorize(built, CONFIG)
    assert (result.verdict, result.stopped_by) == ("pass", "threshold"), result.reason
    assert "dropout off: dropout (Dropout, p=0.1 -> 0)" in result.changes


def test_a_trainer_memorizes_through_the_adapter(tmp_path) -> None:
    torch.manual_seed(0)
    result = memorize(dlci.Target.from_transformers(trainer(bert(), tmp_path)), CONFIG)
    assert (result.verdict, result.stopped_by) == ("pass", "threshold"), result.reason
    assert result.hparams["lr"] == 1e-3  # the Trainer's own create_optimizer


def test_a_causal_lm_memorizes_its_own_loss() -> None:
    """GPT-2 style: the labels are the input ids; the model shifts them itself."""
    config = GPT2Config(vocab_size=len(tokenizer()), n_positions=32, n_embd=32, n_layer=2, n_head=2)
    rows = [{"input_ids": r["input_ids"], "labels": r["input_ids"]} for r in encoded(16, seed=0)]
    collate = DataCollatorWithPadding(tokenizer())

    def pad(features):  # the labels padded with -100, as a language-modelling collator does
        batch = collate([{"input_ids": f["input_ids"]} for f in features])
        batch["labels"] = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
        return batch

    torch.manual_seed(0)
    built = dlci.Target.from_transformers(
        GPT2LMHeadModel(config), rows, data_collator=pad, batch_size=16,
        optimizer=lambda params: torch.optim.AdamW(params, lr=3e-3),
    )  # fmt: skip
    assert built.num_classes is None
    result = memorize(built, MemorizeConfig(max_epochs=300, max_loss=0.5, time_cap_s=120))
    assert result.verdict == "pass", result.reason
    causal = run_checks(built, checks=select("causality"), tier=TIER)[0]  # no false alarm
    assert causal.status == "pass" and "GPT2LMHeadModel is a causal" in causal.measured, causal


def test_a_model_that_takes_its_labels_under_other_names_memorizes() -> None:
    """A question-answering head takes start_positions and end_positions, as the Trainer
    finds them (label_names): they are the targets, together. Before, the adapter looked for
    'labels' only and stopped: "dl-ci cannot tell the targets from the inputs"."""
    from transformers import BertForQuestionAnswering

    from dlci.training import transformers_target

    config = bert(labels=2).config  # a QA head scores a start and an end per token
    rows = [
        {"input_ids": r["input_ids"], "start_positions": 1, "end_positions": 3}
        for r in encoded(32, seed=0)
    ]
    torch.manual_seed(0)
    model = BertForQuestionAnswering(config)
    assert transformers_target.label_names(model) == ("start_positions", "end_positions")
    built = dlci.Target.from_transformers(
        model, rows, data_collator=DataCollatorWithPadding(tokenizer()), batch_size=16,
        optimizer=lambda params: torch.optim.AdamW(params, lr=3e-3),
    )  # fmt: skip
    inputs, targets = next(iter(built.train_loader))
    assert set(targets) == {"start_positions", "end_positions"} and "start_positions" not in inputs
    result = memorize(built, MemorizeConfig(max_epochs=200, max_loss=0.5, time_cap_s=60))
    assert result.verdict == "pass", result.reason
    # the control: looking for 'labels' alone, as before, cannot split the batch
    loader = transformers_target.PairLoader(built.train_loader.loader, "the training data")
    with pytest.raises(DlciError, match="cannot tell the targets from the inputs"):
        next(iter(loader))


def test_label_alignment_at_the_default_rate_says_it_could_not_judge() -> None:
    """Tiny BERT at Transformers' default 5e-5: after 240 steps neither copy has learned
    anything (1.38 = ln 4 on both), which is no verdict on the labels. Before: a failure
    blaming them. (The control, labels that do fit and do not generalise, fail: see
    tests/test_doctor_evidence.py.)"""
    from transformers_example.target import make_target

    torch.manual_seed(0)
    result = run_checks(make_target(lr=5e-5), checks=select("label-alignment"), tier=TIER)[0]
    assert result.status == "warn" and result.details["inconclusive"], result
    assert result.details["steps"] == 240
    assert "the loop learns nothing at this rate in these steps" in result.cause
    assert "on one batch does not learn it" in result.details["loop_learns"]  # the probe


def _trainer_weights(model, tmp_path: Path, steps: int) -> list[torch.Tensor]:
    args = {"max_steps": steps, "lr_scheduler_type": "constant", "weight_decay": 0.5}
    trainer(model, tmp_path, examples=16, **args).train()
    return [p.detach().clone() for p in model.parameters()]


def _adapter_weights(model, tmp_path: Path, steps: int, **kwargs) -> list[torch.Tensor]:
    built = trainer(model, tmp_path, examples=16, weight_decay=0.5)
    built = dlci.Target.from_transformers(built, **kwargs)
    batch = next(iter(built.train_loader))
    optimizer = built.optimizer([p for p in model.parameters() if p.requires_grad])
    for _ in range(steps):
        built.train_step(model, batch, optimizer)
    return [p.detach().clone() for p in model.parameters()]


def test_the_adapter_trains_as_the_trainer_does(tmp_path) -> None:
    """Three steps on one batch of 16: the same weights as ``Trainer.train(max_steps=3)``
    (its AdamW with no decay on biases and LayerNorm, clipping at max_grad_norm,
    compute_loss)."""
    torch.manual_seed(0)
    model = bert(dropout=0.0)
    twin = copy.deepcopy(model)
    start = [p.detach().clone() for p in model.parameters()]
    by_trainer = _trainer_weights(model, tmp_path, 3)
    by_adapter = _adapter_weights(twin, tmp_path, 3)
    assert any((a - b).abs().max() > 1e-3 for a, b in zip(by_adapter, start, strict=True))
    for a, b in zip(by_trainer, by_adapter, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_control_an_optimizer_not_the_trainer_s_gives_other_weights(tmp_path) -> None:
    """The comparison above can fail: AdamW decaying every tensor (not the Trainer's groups)
    after the same steps gives other weights."""
    torch.manual_seed(0)
    model = bert(dropout=0.0)
    twin = copy.deepcopy(model)
    by_trainer = _trainer_weights(model, tmp_path, 3)
    everything = lambda params: torch.optim.AdamW(params, lr=1e-3, weight_decay=0.5)  # noqa: E731
    by_adapter = _adapter_weights(twin, tmp_path, 3, optimizer=everything)
    assert any((a - b).abs().max() > 1e-4 for a, b in zip(by_trainer, by_adapter, strict=True))


def test_padded_batches_of_different_lengths_make_one_batch() -> None:
    collate = DataCollatorWithPadding(tokenizer())
    loader = torch.utils.data.DataLoader(encoded(64, seed=0), batch_size=8, collate_fn=collate)
    batches = list(loader)
    lengths = [b["input_ids"].shape[1] for b in batches]
    assert len(set(lengths[:4])) > 1  # the collator pads each batch to its own longest
    first, second = list(GroupedBatches(loader, pad_id=0, size=32))[:2]
    assert first["input_ids"].shape == (32, max(lengths[:4]))
    assert first["attention_mask"].shape == first["input_ids"].shape
    shorter = lengths.index(min(lengths[:4]))
    rows = slice(8 * shorter, 8 * shorter + 8)
    assert bool((first["attention_mask"][rows, lengths[shorter] :] == 0).all())  # padding hidden
    assert bool((first["input_ids"][rows, lengths[shorter] :] == 0).all())
    assert torch.equal(second["input_ids"], batches[4]["input_ids"])  # then the loader's own


def test_the_trainer_with_an_optimizer_instance_is_refused(tmp_path) -> None:
    model = bert()
    built = trainer(model, tmp_path)
    built.optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(DlciError, match="given an optimizer instance") as caught:
        dlci.Target.from_transformers(built)
    assert "optimizer_cls_and_kwargs" in (caught.value.hint or "")


def test_what_cannot_be_a_transformers_target_is_a_clear_error(tmp_path) -> None:
    with pytest.raises(DlciError, match=r"a PreTrainedModel, a PEFT model .* got Linear"):
        dlci.Target.from_transformers(torch.nn.Linear(2, 2), [])
    with pytest.raises(DlciError, match="no train_dataset"):
        dlci.Target.from_transformers(bert())
    with pytest.raises(DlciError, match="batch_size given with a Trainer"):
        dlci.Target.from_transformers(trainer(bert(), tmp_path), batch_size=4)
    rows = [{"input_ids": r["input_ids"]} for r in encoded(16, seed=0)]
    built = dlci.Target.from_transformers(
        bert(), rows, data_collator=DataCollatorWithPadding(tokenizer())
    )
    with pytest.raises(DlciError, match="cannot tell the targets from the inputs") as caught:
        memorize(built, CONFIG)
    assert "'labels'" in (caught.value.hint or "")


def test_a_missing_framework_names_the_extra(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(DlciError, match="needs transformers") as caught:
        dlci.Target.from_transformers(torch.nn.Linear(2, 2), [])
    assert caught.value.hint == "pip install 'dl-ci[transformers]'"


def test_memorize_passes_on_the_example(monkeypatch, tmp_path) -> None:
    monkeypatch.chdir(EXAMPLE)
    monkeypatch.syspath_prepend(str(EXAMPLE))
    assert main(["memorize", "--budget", "pr", "--out", str(tmp_path), "--quiet"]) == 0
    report = json.loads((tmp_path / "memorization.json").read_text())
    assert report["verdict"] == "pass"


def test_doctor_runs_every_check_on_the_example_with_no_false_alarm(monkeypatch, tmp_path) -> None:
    monkeypatch.chdir(EXAMPLE)
    monkeypatch.syspath_prepend(str(EXAMPLE))
    code = main(["doctor", "--budget", "pr", "--out", str(tmp_path)])
    report = json.loads((tmp_path / "doctor.json").read_text())
    statuses = {c["id"]: c["status"] for c in report["checks"]}
    assert code == 0 and report["verdict"] == "pass", statuses
    assert set(statuses.values()) <= {"pass", "skip"}, statuses
    skipped = {c["id"]: c["cause"] for c in report["checks"] if c["status"] == "skip"}
    assert set(skipped) == {"input-normalization", "causality"}, skipped  # not a causal LM


def test_held_out_data_is_scored_by_the_model_s_own_loss(tmp_path) -> None:
    """label-alignment scores held-out data with the loss the model computes from labels."""
    built = dlci.Target.from_transformers(trainer(bert(), tmp_path), eval_dataset=encoded(64, 1))
    inputs, labels = next(iter(built.val_loader))
    outputs = built.eval_step(built.model, (inputs, labels))
    assert float(built.loss_fn(outputs, labels)) == pytest.approx(float(outputs.loss))
    assert not built.model.training  # eval_step runs in eval mode, as evaluation does


def test_profile_runs_through_the_adapter(monkeypatch, tmp_path) -> None:
    monkeypatch.syspath_prepend(str(EXAMPLE))
    spec = "transformers_example.target:make_trainer_target"
    args = ["profile", "--target", spec, "--steps", "3", "--out", str(tmp_path), "--quiet"]
    assert main(args) == 0
    report = json.loads((tmp_path / "utilization.json").read_text())
    assert report["steps"]["count"] == 3
    phases = report["phases"]["pct"]
    assert phases["forward"] > 0 and phases["backward"] > 0 and phases["optimizer"] > 0
