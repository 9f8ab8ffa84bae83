"""What the framework adapters share: a framework's batches as (inputs, targets) pairs and
back, the framework's own optimizer code run over the parameters dl-ci passes, and one message
for a framework that is not installed.

Nothing here imports a framework: Lightning and Transformers are imported only by the adapter
a user calls (lightning_target.py, transformers_target.py).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from dlci.errors import DlciError

# dict keys that hold the targets of a batch, in the order they are looked for
LABEL_KEYS = ("labels", "label", "targets", "target", "y")


def require(module_name: str, extra: str, what: str) -> Any:
    """Import a framework for ``what``, or say which extra installs it."""
    try:
        return importlib.import_module(module_name)
    except ImportError as exc:
        raise DlciError(
            f"{what} needs {module_name.split('.')[0]}, which cannot be imported ({exc})",
            hint=f"pip install 'dl-ci[{extra}]'",
        ) from None


@dataclass(frozen=True)
class Layout:
    """Where the targets sit in a framework's batch: the second of a pair (``pair``), the last
    of a longer tuple (``tuple``), or a key of a dict (``dict``)."""

    kind: str
    key: str = ""
    size: int = 2
    names: tuple[str, ...] = ()  # kind "dicts": every one of these keys is a target

    @classmethod
    def of(
        cls, batch: Any, where: str, keys: tuple[str, ...] = LABEL_KEYS, every: bool = False
    ) -> Layout:
        """The layout of ``batch``, the first batch of a loader; ``keys``: where a dict's
        targets may be (``every``: all of them are, together).

        >>> Layout.of((1, 2), "x").kind, Layout.of([1, 2, 3], "x").size
        ('pair', 3)
        >>> Layout.of({"y": 1}, "x").key
        'y'
        >>> Layout.of({"a": 1, "s": 2, "e": 3}, "x", ("s", "e"), every=True).names
        ('s', 'e')
        """
        if isinstance(batch, tuple | list) and len(batch) >= 2 and keys == LABEL_KEYS:
            return cls("pair") if len(batch) == 2 else cls("tuple", size=len(batch))
        if every and isinstance(batch, Mapping) and all(key in batch for key in keys):
            return cls("dicts", names=keys)  # several targets: a QA head's start and end
        if isinstance(batch, Mapping):  # a dict, or Transformers' BatchEncoding
            for key in keys:
                if key in batch:
                    return cls("dict", key=key)
        shown = (
            f"a dict with keys {sorted(map(str, batch))[:8]}"
            if isinstance(batch, dict)
            else (f"a {type(batch).__name__}")
        )
        raise DlciError(
            f"{where} yields {shown}: dl-ci cannot tell the targets from the inputs",
            hint=f"yield dicts with the key {keys[0]!r}"
            if keys != LABEL_KEYS
            else "yield (inputs, targets) tuples, tuples whose last item is the targets, or "
            f"dicts with one of the keys {', '.join(keys)}",
        )

    def split(self, batch: Any, where: str) -> tuple[Any, Any]:
        """The batch as an (inputs, targets) pair."""
        if self.kind == "dict" and isinstance(batch, Mapping) and self.key in batch:
            inputs = {k: v for k, v in batch.items() if k != self.key}
            return inputs, batch[self.key]
        if self.kind == "dicts" and isinstance(batch, Mapping) and set(self.names) <= set(batch):
            inputs = {k: v for k, v in batch.items() if k not in self.names}
            return inputs, {k: batch[k] for k in self.names}
        if self.kind != "dict" and isinstance(batch, tuple | list) and len(batch) == self.size:
            if self.kind == "pair":
                return batch[0], batch[1]
            return tuple(batch[:-1]), batch[-1]
        raise DlciError(
            f"{where} yields a {type(batch).__name__} where its first batch was laid out as {self}",
            hint="yield every batch in the same layout",
        )

    def join(self, pair: Any) -> Any:
        """The framework's batch again, from an (inputs, targets) pair."""
        inputs, targets = pair
        if self.kind == "dict":
            return {**inputs, self.key: targets}
        if self.kind == "dicts":
            return {**inputs, **targets}
        if self.kind == "tuple":
            return (*inputs, targets)
        return inputs, targets


class PairLoader:
    """A framework's loader seen as an iterable of (inputs, targets) pairs.

    Every other attribute (``sampler``, ``generator``, ``num_workers``, ``dataset``) is the
    loader's own, so the checks that read them see the real loader.
    """

    def __init__(
        self, loader: Any, where: str, keys: tuple[str, ...] = LABEL_KEYS, every: bool = False
    ) -> None:
        self.loader = loader
        self.where = where
        self.keys = keys
        self.every = every
        self.layout: Layout | None = None

    def __iter__(self) -> Iterator[tuple[Any, Any]]:
        for batch in self.loader:
            if self.layout is None:
                self.layout = Layout.of(batch, self.where, self.keys, self.every)
            yield self.layout.split(batch, self.where)

    def __len__(self) -> int:
        return len(self.loader)

    @property
    def collate_fn(self) -> Any:
        """The loader's collate function, giving pairs too (a check collates examples itself)."""
        collate = getattr(self.loader, "collate_fn", None)
        if collate is None:
            return None

        def pairs(items: Any) -> tuple[Any, Any]:
            batch = collate(items)
            if self.layout is None:
                self.layout = Layout.of(batch, self.where, self.keys, self.every)
            return self.layout.split(batch, self.where)

        return pairs

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("loader", "where", "keys", "every", "layout"):
            raise AttributeError(name)
        return getattr(self.loader, name)

    def join(self, pair: Any) -> Any:
        """A pair this loader gave, as the framework's batch again."""
        layout = self.layout or Layout("pair")
        return layout.join(pair)


@contextmanager
def parameters_swapped(module: Any, params: list[Any]) -> Iterator[None]:
    """The module's trainable parameters replaced, in order, by ``params`` for the block.

    dl-ci builds optimizers for copies of the model (a check trains a copy); the framework's
    own optimizer code (``configure_optimizers``, ``Trainer.create_optimizer``) reads the
    module's parameters, so for the block they are the copy's.
    """
    own = [p for p in module.parameters() if p.requires_grad]
    if [id(p) for p in own] == [id(p) for p in params]:
        yield
        return
    if len(own) != len(params) or any(a.shape != b.shape for a, b in zip(own, params, strict=True)):
        raise DlciError(
            f"the optimizer factory was given {len(params)} parameter tensors that do not match "
            f"the model's {len(own)} trainable ones",
            hint="an adapter's factory builds optimizers for the model or a copy of it",
        )
    mapping = {id(a): b for a, b in zip(own, params, strict=True)}
    slots = [
        (sub, name, p)
        for sub in module.modules()
        for name, p in sub._parameters.items()
        if p is not None and id(p) in mapping
    ]
    for sub, name, p in slots:
        sub._parameters[name] = mapping[id(p)]
    try:
        yield
    finally:
        for sub, name, p in slots:
            sub._parameters[name] = p


def unwrapped(model: Any, kind: type) -> Any:
    """The ``kind`` module inside a wrapper such as DistributedDataParallel (``.module``)."""
    inner = model
    while not isinstance(inner, kind) and hasattr(inner, "module"):
        inner = inner.module
    if not isinstance(inner, kind):
        raise DlciError(
            f"the step was given a {type(model).__name__}, not the adapter's "
            f"{kind.__name__} or a wrapper of it",
            hint="pass the adapter's Target as it was built",
        )
    return inner
