"""dl-ci: CI gates for deep-learning repositories.

The package imports nothing heavy at the top level: the host-side commands (preflight,
hardware, tier, summary) must start fast and never import torch.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
