"""One place to configure dl-ci per repository: dlci.toml, or ``[tool.dlci]`` in pyproject.toml.

``resolve()`` gives every key's value and where it came from, by one precedence rule, and the
doctor's policy (waivers and thresholds); ``dlci.config.trust.trusted_config`` is what a pull
request gets (trusted keys from its base commit). No torch here: the action's host reads it.
"""

from __future__ import annotations

from dlci.config.resolve import Config, resolve

__all__ = ["Config", "resolve"]
