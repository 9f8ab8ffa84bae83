"""Text batches padded per batch, the first ones read as one group of one length.

A collator such as Transformers' ``DataCollatorWithPadding`` pads each batch to its own
longest example, so two batches of 8 cannot be stacked into the memorization test's batch of
16. :class:`GroupedBatches` reads the loader's first batches until they hold
``GROUP_EXAMPLES`` examples and gives them as one batch, padded to the longest with the value
each key needs: -100 for ``labels`` (the ignore index of Transformers' losses), the pad token
for ``input_ids``, 0 elsewhere (an ``attention_mask`` of 0 hides the padding from the model).
The batches after it are the loader's own, so the checks that train on many batches train on
the loader's batch size.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from dlci.errors import DlciError

GROUP_EXAMPLES = 64  # at least the memorization batch of every shipped tier (16)
IGNORE_INDEX = -100


class GroupedBatches:
    """A loader of dict batches whose first ``size`` examples come as one batch of one length.

    Every other attribute (``sampler``, ``dataset``, ``num_workers``) is the loader's own.
    """

    def __init__(self, loader: Any, pad_id: int, side: str = "right", size: int = GROUP_EXAMPLES):
        self.loader = loader
        self.pad_id = pad_id
        self.side = side
        self.size = size

    def __iter__(self) -> Iterator[Any]:
        group: list[Mapping[str, Any]] = []
        count = 0
        for batch in self.loader:
            if count >= self.size or not isinstance(batch, Mapping):
                yield batch  # after the group; or not a dict: the adapter names the layout
                continue
            group.append(batch)
            count += _examples(batch)
            if count >= self.size:
                yield self.merge(group)
        if group and count < self.size:
            yield self.merge(group)

    def __len__(self) -> int:
        batch_size = getattr(self.loader, "batch_size", None) or 1
        grouped = min(len(self.loader), -(-self.size // batch_size))
        return len(self.loader) - grouped + 1

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("loader", "pad_id", "side", "size"):
            raise AttributeError(name)
        return getattr(self.loader, name)

    def merge(self, batches: list[Mapping[str, Any]]) -> dict[str, Any]:
        """One dict: each key's tensors padded to the longest and stacked along the batch."""
        import torch

        if len(batches) == 1:
            return dict(batches[0])
        keys = list(batches[0])
        if any(list(b) != keys for b in batches):
            raise DlciError(
                "the collated batches do not all have the same keys",
                hint="collate every batch the same way",
            )
        merged: dict[str, Any] = {}
        for key in keys:
            values = [b[key] for b in batches]
            if not all(isinstance(v, torch.Tensor) for v in values):
                merged[key] = values[0] if all(v == values[0] for v in values) else values
                continue
            merged[key] = torch.cat(self._padded(key, values))
        return merged

    def _padded(self, key: str, tensors: list[Any]) -> list[Any]:
        import torch.nn.functional as F

        if len({t.shape[1:] for t in tensors}) == 1:
            return tensors
        if len({t.ndim for t in tensors}) != 1:
            raise DlciError(
                f"the collated batches' {key!r} have different numbers of dimensions",
                hint="collate every batch the same way",
            )
        longest = [max(t.shape[d] for t in tensors) for d in range(tensors[0].ndim)]
        value = IGNORE_INDEX if key == "labels" else self.pad_id if key == "input_ids" else 0
        padded = []
        for t in tensors:
            widths: list[int] = []
            for d in reversed(range(1, t.ndim)):  # F.pad lists the last dimension first
                extra = longest[d] - t.shape[d]
                widths += [extra, 0] if self.side == "left" else [0, extra]
            padded.append(F.pad(t, widths, value=value))
        return padded


def _examples(batch: Mapping[str, Any]) -> int:
    for value in batch.values():
        shape = getattr(value, "shape", None)
        if shape:
            return int(shape[0])
    return 1


def pad_settings(model: Any, collator: Any) -> tuple[int, str]:
    """The pad token id and side: the collator's tokenizer's, else the model config's, else 0
    on the right."""
    tokenizer = getattr(collator, "tokenizer", None)
    pad_id = getattr(tokenizer, "pad_token_id", None)
    if pad_id is None:
        pad_id = getattr(getattr(model, "config", None), "pad_token_id", None)
    side = getattr(tokenizer, "padding_side", "right")
    return (pad_id if isinstance(pad_id, int) else 0), ("left" if side == "left" else "right")
