"""Taking one batch of a given size from any loader."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from dlci.errors import DlciError
from dlci.training.batching import call_model, shard, take_batch


def loader(n: int = 40, batch_size: int = 6) -> DataLoader:
    x = torch.arange(n, dtype=torch.float32).reshape(n, 1)
    return DataLoader(TensorDataset(x, torch.arange(n)), batch_size=batch_size)


def test_small_batches_are_concatenated_up_to_the_size() -> None:
    (inputs, targets), taken = take_batch(loader(batch_size=6), 16)
    assert taken == 16
    assert targets.tolist() == list(range(16))
    assert inputs.shape == (16, 1)


def test_a_large_batch_is_cut_to_the_size() -> None:
    (_, targets), taken = take_batch(loader(batch_size=32), 8)
    assert (taken, targets.tolist()) == (8, list(range(8)))


def test_a_data_set_smaller_than_the_size_gives_what_it_has() -> None:
    (_, targets), taken = take_batch(loader(n=5, batch_size=2), 16)
    assert (taken, len(targets)) == (5, 5)


def test_nested_inputs_and_numpy_arrays_are_supported() -> None:
    items = [({"ids": np.arange(4), "mask": np.ones(4)}, np.zeros(4))] * 3
    (inputs, _), taken = take_batch(items, 10)
    assert taken == 10
    assert isinstance(inputs["ids"], torch.Tensor)
    assert inputs["ids"].tolist() == [0, 1, 2, 3, 0, 1, 2, 3, 0, 1]


@pytest.mark.parametrize(
    ("items", "message"),
    [
        ([torch.zeros(4)], "train_loader item 0 is a Tensor, not an (inputs, targets) pair"),
        (
            [(torch.zeros(4),) * 3],
            "train_loader item 0 is a tuple of length 3, not an (inputs, targets) pair",
        ),
        (
            [(torch.zeros(4), "labels")],
            "train_loader item 0 holds a str; dl-ci needs tensors (or numpy arrays), possibly nested in tuples, lists or dicts",
        ),
        ([], "train_loader yielded no batch"),
    ],
)
def test_a_loader_that_yields_something_else_is_explained(items, message: str) -> None:
    with pytest.raises(DlciError) as info:
        take_batch(items, 8)
    assert info.value.message == message


def test_sharding_gives_each_rank_its_own_examples() -> None:
    batch = (torch.arange(8), torch.arange(8))
    assert shard(batch, 1, 2)[1].tolist() == [1, 3, 5, 7]


def test_inputs_are_passed_to_the_model_by_their_shape() -> None:
    assert call_model(lambda x: x, 1) == 1
    assert call_model(lambda a, b: a + b, (1, 2)) == 3
    assert call_model(lambda *, ids: ids, {"ids": 5}) == 5


def test_batches_of_different_lengths_are_a_located_error_not_a_crash() -> None:
    """A collator that pads each batch to its own longest gives batches that cannot be
    joined: a DlciError naming both shapes (before: torch.cat raised inside dl-ci's own
    code, reported as a bug of dl-ci, exit 3). Control: equal lengths are joined."""
    ragged = [(torch.zeros(4, 7), torch.zeros(4)), (torch.zeros(4, 9), torch.zeros(4))]
    with pytest.raises(DlciError) as caught:
        take_batch(ragged, 8)
    assert "batches have different shapes ([4, 7] and [4, 9])" in caught.value.message
    assert "pad every batch to one length" in (caught.value.hint or "")
    even = [(torch.zeros(4, 7), torch.zeros(4)), (torch.ones(4, 7), torch.zeros(4))]
    (inputs, _), count = take_batch(even, 8)
    assert tuple(inputs.shape) == (8, 7) and count == 8
