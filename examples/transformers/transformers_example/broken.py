"""Deliberately broken variants of the example, each a bug in the user's own data pipeline.

A collator that shifts the labels by one example trains without an error, and even memorizes
a batch (each input keeps one fixed, wrong label), but learns nothing that holds on held-out
data: the label-alignment check catches it.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import DataCollatorWithPadding

import dlci
from transformers_example.target import trainer
from transformers_example.text import tokenizer


class ShiftedLabels(DataCollatorWithPadding):
    """The bug: each example gets the label of the example before it in the batch."""

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, Any]:
        batch = super().__call__(features)
        batch["labels"] = torch.roll(batch["labels"], 1)
        return batch


def make_shifted_labels_target() -> dlci.Target:
    """The Trainer with a collator that shifts the labels."""
    return dlci.Target.from_transformers(trainer(collator=ShiftedLabels(tokenizer())))
