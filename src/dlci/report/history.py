"""The nightly history: one entry per night and hardware class, trends, and drift.

``history.json`` (schema_version 1, kind ``history``) holds at most MAX_ENTRIES entries,
oldest first. Drift is judged per hardware class with the same statistics as a diff
(:mod:`dlci.compare.stats`): the last RECENT nights against the REFERENCE nights before them,
each night one sample; a figure drifts when the whole 95% interval of the change is beyond
its bound. The trend plot is an SVG drawn here (no matplotlib on the runner host).
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dlci.compare import stats
from dlci.report.text import bullets, md, table

SCHEMA_VERSION = 1
KIND = "history"
MAX_ENTRIES = 2000
RECENT, REFERENCE = 3, 14  # nights


@dataclass(frozen=True)
class Figure:
    """A figure the history follows: judged on a log scale (a ratio) or in points."""

    key: str
    title: str
    log: bool
    worse: int  # +1 when a rise is worse, -1 when a fall is
    show: Callable[[float], str]


FIGURES = (
    Figure("gpu_utilization_pct", "GPU utilization", False, -1, lambda v: f"{v:.1f} %"),
    Figure("step_time_us", "step time (median)", True, 1, lambda v: f"{v / 1e3:.2f} ms"),
    Figure("epochs_to_threshold", "epochs to threshold", True, 1, lambda v: f"{v:.0f}"),
)
ENTRY_FIELDS: dict[str, tuple[type, ...]] = {
    "date": (str,),
    "run_id": (str,),
    "sha": (str,),
    "hardware_class": (str,),
    "torch": (str,),
    "gpu_utilization_pct": (int, float),
    "step_time_us": (int, float),
    "epochs_to_threshold": (int,),
    "final_loss": (int, float),
    "coverage_pct": (int, float),
    # the tier each night was judged at: a changed ladder is another tier, not drift
    "budget": (str,),
    "ladder_revision": (str,),
    "threshold_form": (str,),
    "threshold": (int, float),
    "relative_threshold": (int, float),
    "max_epochs": (int,),
}
TIER_FIELDS = (
    "budget", "ladder_revision", "threshold_form", "threshold", "relative_threshold", "max_epochs",
)  # fmt: skip


def empty() -> dict[str, Any]:
    return {"schema_version": SCHEMA_VERSION, "kind": KIND, "entries": []}


def checked(data: Any) -> tuple[dict[str, Any], int]:
    """A history from a file: well-formed entries kept (text cut to 200 characters), the
    number dropped; anything that is not a history is an empty one with every entry dropped."""
    if not isinstance(data, dict) or data.get("kind") != KIND:
        return empty(), 1
    entries = data.get("entries")
    if not isinstance(entries, list):
        return empty(), 1
    kept, dropped = [], 0
    for entry in entries[-MAX_ENTRIES:]:
        clean = _entry(entry)
        if clean is None:
            dropped += 1
        else:
            kept.append(clean)
    return {**empty(), "entries": kept}, dropped + max(0, len(entries) - MAX_ENTRIES)


def _entry(entry: Any) -> dict[str, Any] | None:
    if not isinstance(entry, dict) or not isinstance(entry.get("hardware_class"), str):
        return None
    out: dict[str, Any] = {}
    for key, types in ENTRY_FIELDS.items():
        value: Any = entry.get(key)
        if value is None:
            out[key] = None
        elif isinstance(value, bool) or not isinstance(value, types):
            return None
        elif isinstance(value, str):
            out[key] = value[:200]
        elif not _sane(value):
            return None
        else:
            out[key] = value
    return out


def _sane(value: Any) -> bool:
    """A number a history can plot: finite, and under 1e18 (no integer beyond 64 bits)."""
    if isinstance(value, int):
        return abs(value) <= 10**18
    return math.isfinite(value) and abs(value) <= 1e18


def append(history: dict[str, Any], entry: dict[str, Any]) -> dict[str, Any]:
    """The history with ``entry`` last (a re-run of the same run replaces its entry)."""
    same = (entry.get("run_id"), entry.get("hardware_class"))
    kept = [
        e
        for e in history["entries"]
        if entry.get("run_id") is None or (e.get("run_id"), e.get("hardware_class")) != same
    ]
    return {**history, "entries": [*kept, entry][-MAX_ENTRIES:]}


def by_class(history: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for entry in history["entries"]:
        out.setdefault(entry["hardware_class"], []).append(entry)
    return out


def tier_key(entry: dict[str, Any]) -> tuple[Any, ...]:
    """What the night was judged at: budget, ladder revision and threshold."""
    return tuple(entry.get(key) for key in TIER_FIELDS)


def same_tier(entries: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """The last nights judged at the newest night's tier, and the first of them when an older
    night was judged at another (None when every night shares the tier)."""
    if not entries:
        return entries, None
    key, start = tier_key(entries[-1]), len(entries) - 1
    while start > 0 and tier_key(entries[start - 1]) == key:
        start -= 1
    return entries[start:], (entries[start] if start > 0 else None)


def drift(history: dict[str, Any], bounds: dict[str, float | None]) -> list[dict[str, Any]]:
    """Per class and figure: the recent nights against the reference nights before them,
    among the nights judged at the same tier (a new ladder revision or threshold starts over)."""
    found = []
    for klass, every in by_class(history).items():
        entries, changed = same_tier(every)
        if changed is not None and len(entries) < RECENT + REFERENCE:
            since = changed.get("date") or "?"
            reason = (
                f"another tier since {since} (ladder revision {changed.get('ladder_revision')}, "
                f"{changed.get('threshold_form') or 'absolute'} threshold): the "
                f"{len(every) - len(entries)} nights before it are not compared"
            )
            found += [
                {"hardware_class": klass, "figure": fig.key, "title": fig.title}
                | {"verdict": "another tier", "reason": reason}
                for fig in FIGURES
            ]
            continue
        for fig in FIGURES:
            values = [e[fig.key] for e in entries if e.get(fig.key) is not None]
            recent, reference = values[-RECENT:], values[-RECENT - REFERENCE : -RECENT]
            if len(recent) < RECENT or len(reference) < RECENT:
                continue
            judged = stats.judge(
                reference, recent, bound=bounds.get(fig.key), log=fig.log, worse=fig.worse,
                floor=2.0,
            )  # fmt: skip
            found.append(
                {"hardware_class": klass, "figure": fig.key, "title": fig.title} | judged.to_dict()
            )
    return found


def render_markdown(history: dict[str, Any], found: list[dict[str, Any]]) -> str:
    """The history's section for the job summary: the last night per class, and drift."""
    lines = [f"## dl-ci history: {len(history['entries'])} entries", ""]
    rows = []
    for klass, entries in by_class(history).items():
        last = entries[-1]
        for fig in FIGURES:
            value = last.get(fig.key)
            verdict = next(
                (f for f in found if f["hardware_class"] == klass and f["figure"] == fig.key), None
            )
            shown = "-" if value is None else fig.show(value)
            have = sum(e.get(fig.key) is not None for e in same_tier(entries)[0])
            rows.append(
                [
                    md(klass),
                    fig.title,
                    md(last.get("date") or "?"),
                    shown,
                    md(_trend(verdict, have, len(entries))),
                ]
            )
    lines += [*table(["class", "figure", "last night", "value", "trend"], rows), ""]
    notes = [
        f"{f['hardware_class']}: {f['title']}: {f['reason']}"
        for f in found
        if f["verdict"] in ("regressed", "inconclusive")
    ]
    notes += sorted(
        {f"{f['hardware_class']}: {f['reason']}" for f in found if f["verdict"] == "another tier"}
    )
    if notes:
        lines += [*bullets(md(n) for n in notes), ""]
    lines.append("The trend plot (trend.svg) and history.json are in the history artifact.")
    return "\n".join(lines) + "\n"


def _trend(verdict: dict[str, Any] | None, have: int = 0, nights: int = 0) -> str:
    """The trend cell: the verdict, or why there is none (counting the nights that recorded
    this figure, at the tier of the last night, among all of the class's nights).

    >>> _trend(None, 0, 17)
    'no data: none of 17 nights recorded it'
    >>> _trend(None, 4, 4), _trend(None, 5, 17)
    ('fewer than 6 nights (4)', 'fewer than 6 nights with it (5 of 17)')
    """
    if verdict is None:
        if nights and not have:
            return f"no data: none of {nights} nights recorded it"
        if have == nights:
            return f"fewer than {2 * RECENT} nights ({have})"
        return f"fewer than {2 * RECENT} nights with it ({have} of {nights})"
    return "drift" if verdict["verdict"] == "regressed" else str(verdict["verdict"])


def svg(history: dict[str, Any]) -> str:
    """The trend plot: one panel per figure, one line per hardware class, oldest left; each
    panel with its axes, its value range in the figure's unit, the first, middle and last
    nights' dates, and "no data" where no night recorded the figure."""
    width, panel, left, right = 900, 200, 90, 170
    groups = by_class(history)
    palette = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b")
    plot = width - left - right
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" '
        f'height="{panel * len(FIGURES) + 40}" font-family="sans-serif" font-size="12">',
        '<rect width="100%" height="100%" fill="white"/>',
    ]
    for row, fig in enumerate(FIGURES):
        key, show = fig.key, fig.show
        top = 20 + row * panel
        bottom = top + panel - 35  # the x axis
        parts.append(f'<text x="{left}" y="{top}" font-weight="bold">{fig.title}</text>')
        parts.append(
            f'<polyline fill="none" stroke="#888" '
            f'points="{left},{top + 10} {left},{bottom} {left + plot},{bottom}"/>'
        )
        values = [e[key] for es in groups.values() for e in es if e.get(key) is not None]
        if not values:
            nights = sum(len(es) for es in groups.values())
            parts.append(
                f'<text x="{left + plot / 2}" y="{(top + bottom) / 2}" text-anchor="middle" '
                f'fill="#888">no data: none of {nights} nights recorded {fig.title} '
                "(a CPU runner records no GPU utilization)</text>"
            )
            continue
        low, high = min(values), max(values)
        span = (high - low) or 1.0
        for value, y in (
            (high, top + 15),
            ((high + low) / 2, (top + 15 + bottom) / 2),
            (low, bottom),
        ):
            parts.append(
                f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">'
                f"{html.escape(show(value))}</text>"
            )
        longest = max(groups.values(), key=len)
        count = max(len(longest) - 1, 1)
        for i in sorted({0, count // 2, len(longest) - 1}):
            x = left + plot * i / count
            date = str(longest[i].get("date") or "?")[:10]
            parts.append(
                f'<text x="{x:.1f}" y="{bottom + 16}" text-anchor="middle">'
                f"{html.escape(date)}</text>"
            )
        for color, (klass, entries) in zip(palette * 10, groups.items(), strict=False):
            count = max(len(entries) - 1, 1)
            points = " ".join(
                f"{left + plot * i / count:.1f},"
                f"{top + 15 + (bottom - top - 15) * (1 - (e[key] - low) / span):.1f}"
                for i, e in enumerate(entries)
                if e.get(key) is not None
            )
            parts.append(f'<polyline fill="none" stroke="{color}" points="{points}"/>')
            parts.append(
                f'<text x="{left + plot + 10}" y="{top + 15 + 14 * list(groups).index(klass)}" '
                f'fill="{color}">{html.escape(klass[:20])}</text>'
            )
    parts.append("</svg>")
    return "\n".join(parts) + "\n"
