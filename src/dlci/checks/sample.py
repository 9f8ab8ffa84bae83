"""The data sample the data checks share: examples of both splits, read once per doctor run.

A map-style data set is read by index through the loader's own collate_fn, at evenly spaced
indices when it is larger than the sample, so findings name the data set's own indices and a
split sorted by class is still sampled across its classes. Any other loader is read from its
first batches. The sample is bounded in examples and in bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dlci.checks.base import Context, nbytes
from dlci.training.batching import as_pair, batch_size_of
from dlci.training.guard import user_code

EXAMPLES = {"train": 2048, "val": 1024}
BYTES = {"train": 64 << 20, "val": 32 << 20}


@dataclass
class Split:
    """Examples of one split: each input leaf and the targets as (N, ...) tensors."""

    leaves: dict[str, Any]  # "inputs", "inputs['x']", "inputs[0]" -> (N, ...) on the device
    targets: Any  # (N, ...) tensor, or None when the targets are not one tensor
    indices: list[int]  # each example's index in the data set, or its position in the loader
    by_index: bool  # True: data-set indices; False: positions in the loader's first batches
    total: int | None  # examples in the split, when known

    @property
    def size(self) -> int:
        return len(self.indices)

    def where(self) -> str:
        """How the indices in findings count."""
        return "data-set indices" if self.by_index else "positions in the loader's order"

    def coverage(self) -> str:
        total = f" of {self.total}" if self.total is not None else ""
        return f"{self.size}{total}"

    def flat(self) -> Any:
        """Every leaf flattened to float32 columns, side by side: (N, F)."""
        import torch

        return torch.cat(
            [leaf.reshape(leaf.shape[0], -1).float() for leaf in self.leaves.values()], 1
        )


@dataclass
class Sample:
    train: Split | None
    val: Split | None
    skip: str = ""  # why there is no training sample
    val_skip: str = ""  # why there is no held-out sample


def data_sample(ctx: Context) -> Sample:
    """Both splits' sample, read by the first check that needs it."""
    sample: Sample = ctx.memo("data-sample", lambda: _read(ctx))
    return sample


def _read(ctx: Context) -> Sample:
    train = _split(ctx, ctx.target.train_loader, "train")
    if isinstance(train, str):
        return Sample(None, None, train)
    if ctx.target.val_loader is None:
        return Sample(train, None, val_skip="no val_loader")
    val = _split(ctx, ctx.target.val_loader, "val")
    if isinstance(val, str):
        return Sample(train, None, val_skip=val)
    if val.leaves.keys() != train.leaves.keys():
        return Sample(
            train, None, val_skip="the held-out inputs are laid out unlike the training ones"
        )
    return Sample(train, val)


def _split(ctx: Context, loader: Any, which: str) -> Split | str:
    """One split's sample, or why there is none."""
    import torch

    with user_code(f"{which}_loader"):
        pieces, indices, by_index, total = _pieces(loader, which)
    if not pieces:
        return f"the {which}_loader gave no examples"
    named = [_named(p[0]) for p in pieces]
    inputs = [i for i in named if i is not None]
    if len(inputs) < len(named) or any(i.keys() != inputs[0].keys() for i in inputs):
        return "the inputs are not tensors of one layout in every batch"
    try:
        leaves = {name: torch.cat([i[name] for i in inputs]).to(ctx.device) for name in inputs[0]}
        targets = (
            torch.cat([p[1] for p in pieces]).to(ctx.device)
            if all(isinstance(p[1], torch.Tensor) and p[1].ndim >= 1 for p in pieces)
            else None
        )
    except RuntimeError:  # shapes differ from batch to batch: variable-length examples
        return "the examples differ in shape from batch to batch (variable length)"
    return Split(leaves, targets, indices[: len(next(iter(leaves.values())))], by_index, total)


def _named(inputs: Any, path: str = "inputs") -> dict[str, Any] | None:
    """The input tensors by their path; None when a leaf is not a batched tensor."""
    import torch

    if isinstance(inputs, torch.Tensor):
        return {path: inputs} if inputs.ndim >= 1 else None
    keys = inputs.keys() if isinstance(inputs, dict) else range(len(inputs))
    named: dict[str, Any] = {}
    for key in keys:
        inner = _named(inputs[key], f"{path}[{key!r}]")
        if inner is None:
            return None
        named.update(inner)
    return named or None


def _pieces(loader: Any, which: str) -> tuple[list[Any], list[int], bool, int | None]:
    """(inputs, targets) batches of the sample, the examples' indices, whether they are
    data-set indices, and the split's size."""
    dataset = getattr(loader, "dataset", None)
    size = getattr(loader, "batch_size", None)
    if _map_style(dataset) and isinstance(size, int) and size > 0:
        return _by_index(loader, dataset, size, which)
    return _first_batches(loader, which)


def _map_style(dataset: Any) -> bool:
    from torch.utils.data import IterableDataset

    return (
        dataset is not None
        and not isinstance(dataset, IterableDataset)
        and hasattr(dataset, "__getitem__")
        and hasattr(dataset, "__len__")
    )


def _by_index(
    loader: Any, dataset: Any, chunk: int, which: str
) -> tuple[list[Any], list[int], bool, int | None]:
    from torch.utils.data import default_collate

    collate = getattr(loader, "collate_fn", None) or default_collate
    total = len(dataset)
    if total == 0:
        return [], [], True, 0
    first = as_pair(collate([dataset[0]]), 0)
    count = min(total, EXAMPLES[which], max(1, BYTES[which] // max(1, nbytes(first))))
    indices = [i * total // count for i in range(count)]
    pieces = [
        as_pair(collate([dataset[i] for i in indices[start : start + chunk]]), n)
        for n, start in enumerate(range(0, count, chunk))
    ]
    return pieces, indices, True, total


def _first_batches(loader: Any, which: str) -> tuple[list[Any], list[int], bool, int | None]:
    pieces: list[Any] = []
    count = used = 0
    for n, raw in enumerate(iter(loader)):
        pair = as_pair(raw, n)
        pieces.append(pair)
        used += nbytes(pair)
        count += batch_size_of(pair)
        if count >= EXAMPLES[which] or used >= BYTES[which]:
            break
    dataset = getattr(loader, "dataset", None)
    try:
        total = len(dataset) if dataset is not None else None
    except TypeError:
        total = None
    return pieces, list(range(count)), False, total


def feature_name(split: Split, column: int) -> str:
    """The input position of column ``column`` of :meth:`Split.flat`."""
    for name, leaf in split.leaves.items():
        width = int(leaf[0].numel())
        if column < width:
            shape = tuple(leaf.shape[1:])
            if len(shape) <= 1:
                return f"feature {column}" if name == "inputs" else f"{name} feature {column}"
            place = []
            for extent in reversed(shape):
                place.append(column % extent)
                column //= extent
            return f"{name}[:, {', '.join(map(str, reversed(place)))}]"
        column -= width
    return f"column {column}"
