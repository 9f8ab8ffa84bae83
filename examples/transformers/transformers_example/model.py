"""A tiny BERT-style sequence classifier, built from a config: no weights are downloaded."""

from __future__ import annotations

from transformers import BertConfig, BertForSequenceClassification

from transformers_example.text import NUM_CLASSES, VOCAB


def tiny_bert(num_labels: int = NUM_CLASSES) -> BertForSequenceClassification:
    """Two layers of width 32, randomly initialised.

    >>> model = tiny_bert()
    >>> model.config.num_labels, sum(p.numel() for p in model.parameters()) < 50_000
    (4, True)
    """
    config = BertConfig(
        vocab_size=len(VOCAB),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=32,
        num_labels=num_labels,
    )
    return BertForSequenceClassification(config)
