"""dl-ci: CI gates for deep-learning repositories.

The package imports nothing heavy at the top level: the host-side commands (preflight,
hardware, tier, summary) must start fast and never import torch. ``dlci.Target`` and
``dlci.assert_memorizes`` load on first use.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

__all__ = [
    "Instruments",
    "OptimizerFromModel",
    "Target",
    "__version__",
    "assert_memorizes",
    "profile",
]

_LAZY = {
    "Target": "dlci.training.target",
    "OptimizerFromModel": "dlci.training.target",
    "assert_memorizes": "dlci.memorization.testing",
    "Instruments": "dlci.checks.instruments",
    "profile": "dlci.profiling.capture",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'dlci' has no attribute {name!r}")
