"""Which events a metric counts, by name: the patterns, and masks over interned names."""

from __future__ import annotations

import re
from typing import Any

import numpy as np

NCCL = re.compile(r"nccl|rccl", re.IGNORECASE)
LAUNCH = re.compile(r"^(cuda|hip|cu)(Ext)?(Module)?Launch(Kernel|CooperativeKernel)")
ASYNC_WORK = re.compile(r"^(cuda|hip)Mem(cpy|set)[A-Za-z0-9]*Async")
GRAPH_LAUNCH = re.compile(r"^(cuda|hip)GraphLaunch")
COPY_CALL = re.compile(r"^(cuda|hip|cu)Mem(cpy|set)")  # copies and sets, sync or async
BLOCKING_SYNC = re.compile(
    r"^(cuda|hip)(DeviceSynchronize|StreamSynchronize|EventSynchronize|Memcpy|MemcpyDtoH)$|"
    r"^cu(Ctx|Stream|Event)Synchronize$"
)
BLOCKING_OPS = re.compile(
    r"^aten::(item|_local_scalar_dense|nonzero|masked_select|unique|_unique2|is_nonzero|"
    r"tolist|equal|allclose|repeat_interleave)$"
)
DATA_PATTERNS = (re.compile(r"^enumerate\(DataLoader\)"), re.compile(r"^dlci/data$"))
PHASES = {
    "data_loading": DATA_PATTERNS,
    "optimizer": (
        re.compile(r"^dlci/optimizer$"),
        re.compile(r"^Optimizer\.(step|zero_grad)#"),
        re.compile(r"^## optimizer ##$"),
    ),
    "backward": (
        re.compile(r"^dlci/backward$"),
        re.compile(r"^autograd::engine::evaluate_function"),
        re.compile(r"^## backward ##$"),
    ),
    "forward": (re.compile(r"^dlci/forward$"), re.compile(r"^## forward ##$")),
}


class NameMasks:
    """Boolean masks over interned names, computed once per pattern.

    >>> masks = NameMasks(["aten::mm", "ncclAllReduce"])
    >>> masks.mask(np.array([1, 0, 1]), NCCL).tolist()
    [True, False, True]
    """

    def __init__(self, names: list[str]) -> None:
        self.names = names
        self._cache: dict[Any, Any] = {}

    def mask(self, ids: Any, *patterns: re.Pattern[str]) -> Any:
        """For each name id in ``ids``, whether its name matches one of ``patterns``."""
        key = patterns
        table = self._cache.get(key)
        if table is None:
            table = np.fromiter(
                (any(p.search(n) for p in patterns) for n in self.names),
                dtype=bool,
                count=len(self.names),
            )
            self._cache[key] = table
        if not len(table):
            return np.zeros(len(ids), dtype=bool)
        return table[ids]

    def contains(self, ids: Any, text: str) -> Any:
        """For each name id in ``ids``, whether its name contains ``text``."""
        return self.mask(ids, re.compile(re.escape(text)))
