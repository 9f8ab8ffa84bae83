"""Two memorization runs compared: the differing configuration, the metrics side by side.

The runs are memorization.json files as written (checked by :func:`check_run`, the fields
compared only): their configuration is an open table, compared key by key, and a metric a
file lacks is shown as missing, not as a default. The result is typed (:class:`RunComparison`):
the console table (dlci.report.runs) reads its attributes, msgspec writes it as JSON.
"""

from __future__ import annotations

from typing import Any

import msgspec
from msgspec import UNSET, UnsetType

from dlci.jsonio import describe

METRICS = ("verdict", "best_loss", "best_step", "final_loss", "steps", "wall_time_s")
# what each metric may be besides null: compare-runs shows them side by side
TYPES: dict[str, tuple[type, ...]] = {
    "verdict": (str,),
    "best_loss": (int, float),
    "best_step": (int,),
    "final_loss": (int, float),
    "steps": (int,),
    "wall_time_s": (int, float),
}
MAX_DEPTH = 32  # of the configuration: a run's config is a few levels deep
Metric = str | int | float | None  # a metric's value, as TYPES allows it


class Changed(msgspec.Struct, kw_only=True):
    """A configuration value that differs: RUN_A's and RUN_B's (None: not in the run's)."""

    a: Any
    b: Any


class MetricPair(msgspec.Struct, kw_only=True):
    """A metric side by side, and how RUN_B's differs from RUN_A's."""

    a: Metric
    b: Metric
    difference: str | UnsetType = UNSET


class RunComparison(msgspec.Struct, kw_only=True):
    """Two memorization runs compared (schema_version 2, kind comparison)."""

    schema_version: int = 2
    kind: str = "comparison"
    changed: dict[str, Changed] = {}
    metrics: dict[str, MetricPair] = {}
    not_comparable: list[str] = []
    warnings: list[str] = []
    warning: str = ""  # the warnings in one line


def check_run(run: dict[str, Any]) -> str | None:
    """What is wrong with a field :func:`compare` reads, or None.

    >>> check_run({"config": {"seed": 0}, "best_loss": "low"})
    "best_loss: expected a number, got 'low'"
    >>> check_run({"config": [1]})
    'config: expected an object, got a list'
    >>> check_run({"config": {}, "steps": 2**70})
    'steps: expected an integer, got an integer beyond 64 bits'
    """
    config = run.get("config")
    if not isinstance(config, dict):
        return f"config: expected an object, got {describe(config)}"
    problem = _check_value(config, "config", 0)
    if problem:
        return problem
    for key, types in TYPES.items():
        value = run.get(key)
        if value is None:
            continue
        word = "a string" if types == (str,) else "an integer" if types == (int,) else "a number"
        if isinstance(value, bool) or not isinstance(value, types) or _too_big(value):
            return f"{key}: expected {word}, got {describe(value)}"
    return None


def _too_big(value: Any) -> bool:
    return isinstance(value, int) and abs(value) >= 2**63


def _check_value(value: Any, where: str, depth: int) -> str | None:
    """Configuration values a table can show: nested at most MAX_DEPTH, 64-bit integers."""
    if depth > MAX_DEPTH:
        return f"{where}: nested deeper than {MAX_DEPTH} levels"
    if _too_big(value):
        return f"{where}: expected a 64-bit integer, got {describe(value)}"
    items = (
        value.items()
        if isinstance(value, dict)
        else enumerate(value)
        if isinstance(value, list)
        else ()
    )
    for key, item in items:
        problem = _check_value(item, f"{where}.{key}"[:200], depth + 1)
        if problem:
            return problem
    return None


# what a run ran on: runs that differ in one of these are not comparable
ENVIRONMENT = (
    ("tier.hardware_class", "hardware class"),
    ("hardware.gpu_name", "GPU"),
    ("hardware.device", "device"),
    ("versions.torch", "torch"),
)


def not_comparable(config_a: dict[str, Any], config_b: dict[str, Any]) -> list[str]:
    """Why two runs' results cannot be set against each other: other hardware, another torch.

    >>> not_comparable({"versions.torch": "2.4.0"}, {"versions.torch": "2.5.1"})
    ['torch 2.4.0 (RUN_A) and 2.5.1 (RUN_B)']
    """
    found = []
    for key, what in ENVIRONMENT:
        a, b = config_a.get(key), config_b.get(key)
        if a is not None and b is not None and a != b:
            found.append(f"{what} {str(a)[:80]} (RUN_A) and {str(b)[:80]} (RUN_B)")
    return found


def difference(key: str, a: Any, b: Any) -> str:
    """How RUN_B's metric differs from RUN_A's, in words a table cell can hold.

    >>> difference("steps", 17, 34), difference("best_loss", 0.9, 0.45), difference("steps", 3, 3)
    ('+17 (x2.00)', '-0.45 (x0.50)', 'same')
    >>> difference("wall_time_s", 1.0, 1.2)
    'one timing per run: not judged'
    """
    if a == b:
        return "same"
    if key == "wall_time_s":
        return "one timing per run: not judged"
    numbers = all(isinstance(v, int | float) and not isinstance(v, bool) for v in (a, b))
    if not numbers:
        return "changed"
    delta = f"{b - a:+d}" if isinstance(a, int) and isinstance(b, int) else f"{b - a:+.4g}"
    return f"{delta} (x{b / a:.2f})" if a else delta


def compare(a: dict[str, Any], b: dict[str, Any]) -> RunComparison:
    """The differing configuration values, the metrics side by side, and a warning if due.

    A run is seeded and deterministic on one machine, so with one configuration and one
    environment a difference in results is the code's (or the GPU kernels' nondeterminism);
    runs on other hardware or another torch are flagged as not comparable.
    """
    config_a, config_b = flatten(a["config"]), flatten(b["config"])
    changed = {
        key: Changed(a=config_a.get(key), b=config_b.get(key))
        for key in sorted(set(config_a) | set(config_b))
        if config_a.get(key) != config_b.get(key)
    }
    metrics = {
        key: MetricPair(
            a=a.get(key), b=b.get(key), difference=difference(key, a.get(key), b.get(key))
        )
        for key in METRICS
    }
    blocked = not_comparable(config_a, config_b)
    warnings = []
    if len(changed) > 1:
        warnings.append(
            f"{len(changed)} configuration values differ ({', '.join(changed)}): this comparison "
            "cannot tell which change mattered; change one thing at a time"
        )
    if blocked:
        warnings.append(
            "not comparable: " + "; ".join(blocked) + ": results differ across hardware and "
            "torch versions by themselves"
        )
    return RunComparison(
        changed=changed,
        metrics=metrics,
        not_comparable=blocked,
        warnings=warnings,
        warning="; ".join(warnings),
    )


def flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dicts as dotted keys.

    >>> flatten({"tier": {"budget": "pr", "max_loss": 1.0}, "seed": 0})
    {'tier.budget': 'pr', 'tier.max_loss': 1.0, 'seed': 0}
    """
    flat: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, name + "."))
        else:
            flat[name] = value
    return flat
