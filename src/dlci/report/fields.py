"""The types of the report fields the host renders, checked before anything renders them.

A gate's report is written by code the pull request controls, so any field can hold any JSON
value: a string ``threshold`` crashed the job summary (``Unknown format code 'g'``), a list
where a dict was expected would crash a renderer the same way (issue 35). The host checks
every field it renders against the type dl-ci writes there; a report with a wrong one is a
problem named in the summary (the report is not shown), never a crash. A missing field is
not checked here: the renderers show such a report as incomplete.

A path is dotted keys; ``[]`` stands for every item of a list, ``*`` for every value of an
object.

>>> problems("memorization", {"threshold": "1.0", "tier": {"max_epochs": 3}})
['memorization.json: threshold is text, expected a number or null']
>>> problems("doctor", {"checks": [{"id": "lr", "status": {"x": 1}}]})
['doctor.json: checks[0].status is an object, expected text']
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _text(value: Any) -> bool:  # shown through md(): any scalar is safe, a container is not
    return value is None or isinstance(value, str | int | float | bool)


KINDS: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "text": ("text", _text),
    "number": ("a number", _number),
    "number?": ("a number or null", lambda v: v is None or _number(v)),
    "integer": ("an integer", _integer),
    "integer?": ("an integer or null", lambda v: v is None or _integer(v)),
    "bool": ("true or false", lambda v: isinstance(v, bool)),
    "list": ("a list", lambda v: isinstance(v, list)),
    "object": ("an object", lambda v: isinstance(v, dict)),
    "object?": ("an object or null", lambda v: v is None or isinstance(v, dict)),
}

_TIER = {
    "tier": "object",
    "tier.budget": "text",
    "tier.hardware_class": "text",
    "tier.row": "text",
    "tier.max_epochs": "integer",
    "tier.max_loss": "number?",  # null for a relative row (ladder version 2)
    "tier.max_relative_loss": "number?",
    "tier.time_cap_minutes": "number",
}
_COPY = {"count": "integer", "bytes": "integer", "time_us": "number"}
_COPY |= {"bandwidth_gbps": "number", "exposed_us": "number"}

SPECS: dict[str, dict[str, str]] = {
    "memorization": {
        "verdict": "text",
        "reason": "text",
        "threshold": "number?",
        "relative_threshold": "number?",
        "criterion": "text",
        "next_step": "text",
        "start_loss": "number?",
        "relative_loss": "number?",
        "loss_floor": "number?",
        "blind_loss": "number?",
        "floor_source": "text",
        "case": "text",
        "measured": "list",
        "measured[]": "text",
        "best_loss": "number?",
        "best_step": "integer?",
        "final_loss": "number?",
        "steps": "integer",
        "wall_time_s": "number",
        "setup_time_s": "number",
        "device": "text",
        "world_size": "integer",
        "losses": "list",
        "losses[]": "number?",
        **_TIER,
        "config": "object",
        "config.target": "text",
        "config.seed": "text",
        "config.changes": "list",
        "config.changes[]": "text",
    },
    "doctor": {
        "verdict": "text",
        "reason": "text",
        "counts": "object",
        "counts.*": "integer",
        "checks": "list",
        "checks[]": "object",
        **{f"checks[].{k}": "text" for k in ("id", "status", "measured", "expected")},
        **{f"checks[].{k}": "text" for k in ("cause", "fix")},
        "checks[].waived": "object?",
        "waivers": "list",
        "waivers[]": "object",
        **{f"waivers[].{k}": "text" for k in ("check", "mode", "reason", "until", "source")},
        **{f"waivers[].{k}": "text" for k in ("expired", "applied", "status_without_waiver")},
    },
    "utilization": {
        "gpu_utilization_pct": "number?",
        "trace": "object",
        "trace.cpu_only": "bool",
        "steps": "object",
        "steps.count": "integer",
        "steps.mean_step_us": "number",
        "devices": "list",
        "devices[]": "object",
        "devices[].device": "text",
        "devices[].name": "text",
        "devices[].gpu_utilization_pct": "number?",
        "devices[].busy": "object",
        "devices[].busy.busy_pct": "number?",
        "devices[].temporal_breakdown": "object",
        "devices[].temporal_breakdown.idle_pct": "number",
        "devices[].temporal_breakdown.compute_pct": "number",
        "devices[].temporal_breakdown.non_compute_pct": "number",
        "devices[].idle_gaps": "list",
        "devices[].idle_gaps[]": "object",
        "devices[].idle_gaps[].start_us": "number",
        "devices[].idle_gaps[].duration_us": "number",
        "devices[].idle_gaps[].cause": "text",
        "devices[].idle_gaps[].cpu_op": "object?",
        "devices[].idle_gaps[].cpu_op.name": "text",
        "devices[].copies": "object",
        **{f"devices[].copies.h2d_{k}": "object" for k in ("pageable", "pinned", "other")},
        **{
            f"devices[].copies.h2d_{k}.{field}": kind
            for k in ("pageable", "pinned", "other")
            for field, kind in _COPY.items()
        },
        "syncs": "object",
        "syncs.count": "integer",
        "syncs.per_step": "number",
        "syncs.wait_us": "number",
        "syncs.by_call": "list",
        "syncs.by_call[]": "object",
        "syncs.by_call[].call": "text",
        "syncs.by_call[].caller": "text",
        "syncs.by_call[].count": "integer",
        "syncs.by_call[].wait_us": "number",
        "syncs.by_call[].max_wait_us": "number",
        "breakdown": "object?",
        "breakdown.pct": "object?",
        "breakdown.pct.*": "number",
        "phases": "object?",
        "phases.pct": "object?",
        "phases.pct.*": "number",
        "recommendations": "list",
        "recommendations[]": "object",
        "recommendations[].finding": "text",
        "recommendations[].advice": "text",
        "warnings": "list",
        "warnings[]": "text",
        "gate": "object?",
        "gate.passed": "bool",
        "gate.value": "number?",
        "gate.minimum": "number",
        "gate.message": "text",
        "gate.checks": "list",
        "gate.checks[]": "object",
        "gate.checks[].name": "text",
        "gate.checks[].passed": "text",
        "gate.checks[].message": "text",
        "memory": "object?",
        "memory.steps": "list",
        "memory.steps[]": "object",
        "memory.top_allocations": "list",
        "memory.top_allocations[]": "object",
        "memory.capture": "object?",
        "memory.batch_estimate": "object?",
        **{f"memory.{k}": "text" for k in ("device", "note", "source", "peak_phase")},
    },
}


def _found(data: Any, parts: list[str], where: str) -> Iterator[tuple[str, Any]]:
    """Each value at the path ``parts`` below ``data``, with its concrete location."""
    if not parts:
        yield where, data
        return
    head, rest = parts[0], parts[1:]
    key, each = (head[:-2], True) if head.endswith("[]") else (head, False)
    if key == "*":
        if isinstance(data, dict):
            for name, value in data.items():
                yield from _found(value, rest, f"{where}.{name}" if where else str(name))
        return
    if not isinstance(data, dict) or key not in data:
        return  # missing (or under a value of the wrong type, reported at its own path)
    value, here = data[key], f"{where}.{key}" if where else key
    if not each:
        yield from _found(value, rest, here)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _found(item, rest, f"{here}[{i}]")


def _describe(value: Any) -> str:
    if isinstance(value, bool):
        return "true or false"
    if isinstance(value, str):
        return "text"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return "null" if value is None else "a number"


def problems(kind: str, report: Any, *, limit: int = 5) -> list[str]:
    """Each rendered field of ``report`` (a ``kind`` report) whose type is not dl-ci's."""
    if not isinstance(report, dict):
        return [f"{kind}.json is not an object"]
    found = []
    for path, expected in SPECS[kind].items():
        words, fits = KINDS[expected]
        parts = path.replace("[]", "[]\0").replace(".", "\0").split("\0")
        for where, value in _found(report, [p for p in parts if p], ""):
            if not fits(value):
                found.append(f"{kind}.json: {where} is {_describe(value)}, expected {words}")
    if len(found) > limit:
        found = [*found[:limit], f"{kind}.json: {len(found) - limit} more fields of wrong types"]
    return found
