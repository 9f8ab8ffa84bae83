"""What dl-ci trains: the model and its data through Target.from_transformers, either as a
model with a data set and a collator, or as the Trainer the project trains with."""

from __future__ import annotations

import tempfile

import torch
from transformers import DataCollatorWithPadding, Trainer, TrainingArguments

import dlci
from transformers_example.model import tiny_bert
from transformers_example.text import encoded, tokenizer

TRAIN_EXAMPLES, EVAL_EXAMPLES = 512, 128


def make_target(lr: float = 1e-3) -> dlci.Target:
    """The model, its data sets and a padding collator; the forward computes the loss.

    >>> target = make_target()
    >>> type(target.model).__name__, target.num_classes
    ('BertForSequenceClassification', 4)
    """
    return dlci.Target.from_transformers(
        tiny_bert(),
        encoded(TRAIN_EXAMPLES, seed=0),
        eval_dataset=encoded(EVAL_EXAMPLES, seed=1),
        data_collator=DataCollatorWithPadding(tokenizer()),
        batch_size=16,
        optimizer=lambda params: torch.optim.AdamW(params, lr=lr, weight_decay=0.01),
    )


def trainer(lr: float = 1e-3, collator: object = None) -> Trainer:
    """The Trainer the project would train with (dl-ci never calls ``train()``)."""
    args = TrainingArguments(
        output_dir=tempfile.gettempdir(),  # only written by train(), which dl-ci never calls
        learning_rate=lr,
        per_device_train_batch_size=16,
        report_to=[],
        use_cpu=not torch.cuda.is_available(),
    )
    return Trainer(
        model=tiny_bert(),
        args=args,
        train_dataset=encoded(TRAIN_EXAMPLES, seed=0),
        eval_dataset=encoded(EVAL_EXAMPLES, seed=1),
        data_collator=collator or DataCollatorWithPadding(tokenizer()),
    )


def make_trainer_target() -> dlci.Target:
    """The same model through its Trainer: the Trainer's optimizer, loaders and compute_loss."""
    return dlci.Target.from_transformers(trainer())
