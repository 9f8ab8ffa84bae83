"""One batch of (inputs, targets) from any loader: nested tensors, sliced and moved as one."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from dlci.errors import DlciError


def tree_map(fn: Callable[[Any], Any], obj: Any) -> Any:
    """Apply ``fn`` to every tensor leaf of nested tuples, lists and dicts."""
    if isinstance(obj, dict):
        return {key: tree_map(fn, value) for key, value in obj.items()}
    if isinstance(obj, tuple | list):
        return type(obj)(tree_map(fn, value) for value in obj)
    return fn(obj)


def _leaves(obj: Any) -> list[Any]:
    if isinstance(obj, dict):
        return [leaf for value in obj.values() for leaf in _leaves(value)]
    if isinstance(obj, tuple | list):
        return [leaf for value in obj for leaf in _leaves(value)]
    return [obj]


def _as_tensor(leaf: Any, where: str) -> Any:
    import torch

    if isinstance(leaf, torch.Tensor):
        return leaf
    try:
        import numpy as np

        if isinstance(leaf, np.ndarray):
            return torch.from_numpy(leaf)
    except ImportError:  # pragma: no cover
        pass
    raise DlciError(
        f"{where} holds a {type(leaf).__name__}; dl-ci needs tensors (or numpy arrays), "
        "possibly nested in tuples, lists or dicts",
        hint="convert the data to tensors in your Dataset or collate_fn",
    )


def batch_size_of(batch: tuple[Any, Any]) -> int:
    """Examples in a batch: the first dimension of its first tensor."""
    leaf = _leaves(batch[1])[0] if _leaves(batch[1]) else _leaves(batch[0])[0]
    if getattr(leaf, "ndim", 0) == 0:
        raise DlciError(
            "a batch's targets are a scalar; dl-ci needs a batch dimension first",
            hint="yield batches shaped (batch, ...), as a DataLoader does",
        )
    return int(leaf.shape[0])


def as_pair(batch: Any, index: int) -> tuple[Any, Any]:
    """Check that a loader item is an ``(inputs, targets)`` pair of tensors."""
    if not isinstance(batch, tuple | list) or len(batch) != 2:
        got = (
            f"a {type(batch).__name__} of length {len(batch)}"
            if isinstance(batch, tuple | list)
            else f"a {type(batch).__name__}"
        )
        raise DlciError(
            f"train_loader item {index} is {got}, not an (inputs, targets) pair",
            hint="yield (inputs, targets) batches; for other layouts give your own train_step "
            "and keep the loader's items as (inputs, targets)",
        )
    where = f"train_loader item {index}"
    pair: tuple[Any, Any] = tree_map(lambda leaf: _as_tensor(leaf, where), tuple(batch))
    return pair


def same_rows(pair: tuple[Any, Any], index: int) -> None:
    """Refuse a batch whose tensors do not all have the examples first: dl-ci cuts, splits
    and shuffles batches along the first dimension, so a time-major batch (inputs (L, N),
    targets (L * N,), as a word language model's get_batch makes) would be cut wrongly and
    every check would blame the target's code for dl-ci's mistake."""
    rows = {int(leaf.shape[0]) for leaf in _leaves(pair) if getattr(leaf, "ndim", 0) >= 1}
    if len(rows) > 1:
        shapes = ", ".join(
            f"{where} {tuple(leaf.shape)}"
            for where, part in (("inputs", pair[0]), ("targets", pair[1]))
            for leaf in _leaves(part)
        )
        raise DlciError(
            f"train_loader item {index}: its tensors differ in their first dimension ({shapes}); "
            "dl-ci reads the first dimension as the examples of the batch",
            hint="yield batches with the examples first (batch_first=True; targets (N, ...)); "
            "a time-major batch (L, N) transposes with .t(), its flat targets with "
            ".view(L, N).t()",
        )


def take_batch(loader: Iterable[Any], size: int) -> tuple[tuple[Any, Any], int]:
    """The first ``size`` examples the loader yields, as one batch, and how many there were.

    Batches are concatenated when the loader's batches are smaller than ``size`` and cut
    when they are larger; a data set smaller than ``size`` gives what it has.
    """

    pieces: list[tuple[Any, Any]] = []
    count = 0
    try:
        iterator = iter(loader)
    except TypeError:
        raise DlciError(
            f"train_loader is a {type(loader).__name__}, which is not iterable",
            hint="pass a DataLoader or any iterable of (inputs, targets)",
        ) from None
    for index, raw in enumerate(iterator):
        pair = as_pair(raw, index)
        same_rows(pair, index)
        pieces.append(pair)
        count += batch_size_of(pair)
        if count >= size:
            break
    if not pieces:
        raise DlciError(
            "train_loader yielded no batch", hint="check that the data set is not empty"
        )
    merged = pieces[0] if len(pieces) == 1 else tree_map_many(_concatenate, pieces)
    taken = min(size, count)
    return tree_map(lambda leaf: leaf[:taken], merged), taken


def _concatenate(*leaves: Any) -> Any:
    """One leaf of the merged batch: the loader's batches, joined along the first axis."""
    import torch

    shapes = [tuple(getattr(leaf, "shape", ())) for leaf in leaves]
    differ = next((shape for shape in shapes if shape[1:] != shapes[0][1:]), None)
    if differ is not None:
        raise DlciError(
            f"train_loader's batches have different shapes ({list(shapes[0])} and "
            f"{list(differ)}): they cannot be joined into one batch of the size asked for",
            hint="pad every batch to one length (a collator with a fixed max_length), or give "
            "the loader a batch size at least the test's batch size",
        )
    return torch.cat(leaves)


def tree_map_many(fn: Callable[..., Any], trees: list[Any]) -> Any:
    """Combine same-shaped trees leaf by leaf."""
    first = trees[0]
    if isinstance(first, dict):
        return {key: tree_map_many(fn, [t[key] for t in trees]) for key in first}
    if isinstance(first, tuple | list):
        return type(first)(tree_map_many(fn, [t[i] for t in trees]) for i in range(len(first)))
    return fn(*trees)


def shard(batch: tuple[Any, Any], rank: int, world: int) -> tuple[Any, Any]:
    """This rank's share of a batch (examples rank, rank + world, ...), for DDP."""
    share: tuple[Any, Any] = tree_map(lambda leaf: leaf[rank::world], batch)
    return share


def to_device(batch: Any, device: Any) -> Any:
    return tree_map(lambda leaf: leaf.to(device, non_blocking=True), batch)


def call_model(model: Any, inputs: Any) -> Any:
    """``model(x)`` for a tensor, ``model(*x)`` for a tuple or list, ``model(**x)`` for a dict."""
    if isinstance(inputs, dict):
        return model(**inputs)
    if isinstance(inputs, tuple | list):
        return model(*inputs)
    return model(inputs)


def score_candidates(outputs: Any, rows: int | None = None) -> list[Any]:
    """The tensors of a model's outputs that could be its per-example scores: the outputs
    themselves when one tensor, their ``logits`` when named (a ``ModelOutput``, a dict), else
    every floating tensor of a tuple, list or dict (not ``loss``) with one row per example
    (``rows``, when known; a 0-d loss is passed over)."""
    import torch

    if isinstance(outputs, torch.Tensor):
        return [outputs]
    named = outputs.get("logits") if isinstance(outputs, dict) else None
    named = named if named is not None else getattr(outputs, "logits", None)
    if isinstance(named, torch.Tensor):
        return [named]
    if isinstance(outputs, dict):
        items = [v for k, v in outputs.items() if k != "loss"]
    elif isinstance(outputs, tuple | list):
        items = list(outputs)
    else:
        return []
    return [
        item
        for item in items
        if isinstance(item, torch.Tensor)
        and item.is_floating_point()
        and item.ndim >= 1
        and (rows is None or item.shape[0] == rows)
    ]


def logits_of(outputs: Any, rows: int | None = None, classes: int | None = None) -> Any:
    """The tensor of per-example scores in a model's outputs (``score_candidates``): with
    ``classes`` known, the first whose last dimension is that many; else the first. The
    outputs themselves when there is none.

    >>> import torch
    >>> logits = torch.zeros(4, 3)
    >>> logits_of((logits, torch.tensor(0.5))) is logits
    True
    >>> logits_of({"loss": torch.tensor(1.0), "logits": logits}) is logits
    True
    >>> logits_of((torch.zeros(2, 3), logits), rows=4) is logits
    True
    >>> logits_of((torch.zeros(4, 64), logits), rows=4, classes=3) is logits
    True
    """
    found = score_candidates(outputs, rows)
    if classes:
        for item in found:
            if item.shape[-1] == classes:
                return item
    return found[0] if found else outputs
