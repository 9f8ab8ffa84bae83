"""A small synthetic text task: short sentences about one of four topics, and a word-level
tokenizer built here (nothing is downloaded)."""

from __future__ import annotations

import random
from typing import Any

from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

TOPICS = {
    "sports": ["goal", "match", "team", "score", "coach", "league"],
    "food": ["bread", "soup", "spice", "dinner", "recipe", "cheese"],
    "tech": ["code", "chip", "server", "laptop", "network", "robot"],
    "weather": ["rain", "storm", "sunny", "cloud", "wind", "snow"],
}
FILLER = ["the", "a", "today", "was", "very", "and", "we", "saw", "about", "new", "old", "it"]
SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]"]
VOCAB = SPECIAL + FILLER + [word for words in TOPICS.values() for word in words]
NUM_CLASSES = len(TOPICS)


def tokenizer() -> PreTrainedTokenizerFast:
    """A word-level tokenizer over the task's vocabulary, with BERT's special tokens.

    >>> tokenizer()("the goal was new")["input_ids"]
    [2, 4, 16, 7, 13, 3]
    """
    vocab = {word: i for i, word in enumerate(VOCAB)}
    core = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))  # noqa: S106 (not a secret)
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    core.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        special_tokens=[("[CLS]", VOCAB.index("[CLS]")), ("[SEP]", VOCAB.index("[SEP]"))],
    )
    special = dict(zip(("pad_token", "unk_token", "cls_token", "sep_token"), SPECIAL, strict=True))
    return PreTrainedTokenizerFast(tokenizer_object=core, model_max_length=32, **special)


def sentences(count: int, seed: int) -> list[tuple[str, int]]:
    """``count`` seeded sentences: a few filler words and two words of the labelled topic.

    >>> sentences(2, seed=0)
    [('sunny the cloud very about saw', 3), ('server a network new', 2)]
    """
    rng = random.Random(seed)  # noqa: S311 (synthetic data, not a secret)
    names = list(TOPICS)
    rows = []
    for _ in range(count):
        label = rng.randrange(len(names))
        words = [rng.choice(FILLER) for _ in range(rng.randrange(1, 6))]
        words += rng.sample(TOPICS[names[label]], 2)
        rng.shuffle(words)
        rows.append((" ".join(words), label))
    return rows


def encoded(count: int, seed: int) -> list[dict[str, Any]]:
    """The sentences tokenized, one dict per example with its ``labels``, unpadded."""
    tok = tokenizer()
    return [{**tok(text), "labels": label} for text, label in sentences(count, seed)]
