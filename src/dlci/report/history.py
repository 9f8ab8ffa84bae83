"""The nightly history: one entry per night and hardware class, trends, and drift.

``history.json`` (schema_version 1, kind ``history``) holds at most MAX_ENTRIES entries,
oldest first. Drift is judged per hardware class with the same statistics as a diff
(:mod:`dlci.compare.stats`): the last RECENT nights against the REFERENCE nights before them,
each night one sample; a figure drifts when the whole 95% interval of the change is beyond
its bound. The trend plot is an SVG drawn here (no matplotlib on the runner host).
"""

from __future__ import annotations

import html
import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dlci import schema
from dlci.compare import stats
from dlci.jsonio import describe
from dlci.report.fields import History, HistoryEntry
from dlci.report.text import bullets, md, table

SCHEMA_VERSION = 1
KIND = "history"
MAX_ENTRIES = 2000
RECENT, REFERENCE = 3, 14  # nights
NAMED = 5  # left-out entries named in a warning; the rest are counted


@dataclass(frozen=True)
class Figure:
    """A figure the history follows: judged on a log scale (a ratio) or in points."""

    key: str
    title: str
    log: bool
    worse: int  # +1 when a rise is worse, -1 when a fall is
    show: Callable[[float], str]
    value: Callable[[HistoryEntry], float | None]  # the night's, None when not recorded


FIGURES = (
    Figure("gpu_utilization_pct", "GPU utilization", False, -1, lambda v: f"{v:.1f} %",
           lambda e: e.gpu_utilization_pct),
    Figure("step_time_us", "step time (median)", True, 1, lambda v: f"{v / 1e3:.2f} ms",
           lambda e: e.step_time_us),
    Figure("epochs_to_threshold", "epochs to threshold", True, 1, lambda v: f"{v:.0f}",
           lambda e: e.epochs_to_threshold),
)  # fmt: skip
# the tier each night was judged at: a changed ladder is another tier, not drift
TIER_FIELDS = (
    "budget", "ladder_revision", "threshold_form", "threshold", "relative_threshold", "max_epochs",
)  # fmt: skip


@dataclass(frozen=True)
class Drift:
    """One figure of one class judged: the recent nights against the reference nights."""

    hardware_class: str
    figure: str
    title: str
    verdict: str  # ok, regressed, likely regressed, inconclusive, not gated, another tier
    reason: str


def empty() -> History:
    return History(schema_version=SCHEMA_VERSION, kind=KIND, entries=[])


def checked(data: Any) -> tuple[History, int, list[str]]:
    """A history from a file: the well-formed entries kept (text cut to 200 characters), the
    number left out, and why each was, named (at most NAMED); anything that is not a history
    is an empty one with one entry left out.

    >>> history, dropped, why = checked({"kind": "history", "entries": [
    ...     {"hardware_class": "a100", "gpu_utilization_pct": 80},
    ...     {"hardware_class": "a100", "gpu_utilization_pct": "high"}, {"date": "x"}]})
    >>> [e.gpu_utilization_pct for e in history.entries], dropped
    ([80], 2)
    >>> for line in why: print(line)
    history.json: entries[1].gpu_utilization_pct is 'high', expected a number or null
    history.json: entries[2].hardware_class is missing, expected text
    >>> checked([])[1:]
    (1, ['history.json is not a history (an object of kind history with a list of entries)'])
    """
    entries = data.get("entries") if isinstance(data, dict) else None
    if not isinstance(data, dict) or data.get("kind") != KIND or not isinstance(entries, list):
        return empty(), 1, [f"{KIND}.json is not a history (an object of kind {KIND} with a "
                            "list of entries)"]  # fmt: skip
    kept, why = [], []
    over = max(0, len(entries) - MAX_ENTRIES)
    for index, entry in enumerate(entries[-MAX_ENTRIES:], start=over):
        clean, problem = _entry(entry, f"entries[{index}]")
        if clean is None:
            why.append(f"{KIND}.json: {problem}")
        else:
            kept.append(clean)
    if over:
        why.append(f"{KIND}.json: the {over} oldest entries, beyond {MAX_ENTRIES}")
    named = why[:NAMED] + ([f"{KIND}.json: more entries left out"] if len(why) > NAMED else [])
    return History(entries=kept), len(entries) - len(kept), named


def _entry(entry: Any, where: str) -> tuple[HistoryEntry | None, str]:
    """A well-formed entry (text cut to 200 characters), else None and its first problem."""
    if not isinstance(entry, dict):
        return None, f"{where} is {describe(entry)}, expected an object"
    if "hardware_class" not in entry:
        return None, f"{where}.hardware_class is missing, expected text"
    for here, value, words in itertools.islice(schema.mismatches(HistoryEntry, entry, where), 1):
        return None, f"{here} is {describe(value)}, expected {words}"
    values: dict[str, Any] = {}
    for name in HistoryEntry.__struct_fields__:
        value = entry.get(name)
        if isinstance(value, str):
            value = value[:200]
        elif value is not None and not _sane(value):
            return None, f"{where}.{name} is {describe(value)}, beyond what a history plots"
        values[name] = value
    # the types are checked: the values as they were read (an integer stays one)
    return HistoryEntry(**values), ""


def _sane(value: Any) -> bool:
    """A number a history can plot: finite, and under 1e18 (no integer beyond 64 bits)."""
    if isinstance(value, int):
        return abs(value) <= 10**18
    return math.isfinite(value) and abs(value) <= 1e18


def append(history: History, entry: HistoryEntry) -> History:
    """The history with ``entry`` last (a re-run of the same run replaces its entry)."""
    same = (entry.run_id, entry.hardware_class)
    kept = [
        e for e in history.entries if entry.run_id is None or (e.run_id, e.hardware_class) != same
    ]
    return History(
        schema_version=history.schema_version,
        kind=history.kind,
        entries=[*kept, entry][-MAX_ENTRIES:],
    )


def by_class(history: History) -> dict[str, list[HistoryEntry]]:
    out: dict[str, list[HistoryEntry]] = {}
    for entry in history.entries:
        out.setdefault(entry.hardware_class, []).append(entry)
    return out


def tier_key(entry: HistoryEntry) -> tuple[str | float | None, ...]:
    """What the night was judged at: budget, ladder revision and threshold."""
    return (
        entry.budget,
        entry.ladder_revision,
        entry.threshold_form,
        entry.threshold,
        entry.relative_threshold,
        entry.max_epochs,
    )


def same_tier(entries: list[HistoryEntry]) -> tuple[list[HistoryEntry], HistoryEntry | None]:
    """The last nights judged at the newest night's tier, and the first of them when an older
    night was judged at another (None when every night shares the tier)."""
    if not entries:
        return entries, None
    key, start = tier_key(entries[-1]), len(entries) - 1
    while start > 0 and tier_key(entries[start - 1]) == key:
        start -= 1
    return entries[start:], (entries[start] if start > 0 else None)


def drift(history: History, bounds: dict[str, float | None]) -> list[Drift]:
    """Per class and figure: the recent nights against the reference nights before them,
    among the nights judged at the same tier (a new ladder revision or threshold starts over)."""
    found = []
    for klass, every in by_class(history).items():
        entries, changed = same_tier(every)
        if changed is not None and len(entries) < RECENT + REFERENCE:
            since = changed.date or "?"
            reason = (
                f"another tier since {since} (ladder revision {changed.ladder_revision}, "
                f"{changed.threshold_form or 'absolute'} threshold): the "
                f"{len(every) - len(entries)} nights before it are not compared"
            )
            found += [Drift(klass, fig.key, fig.title, "another tier", reason) for fig in FIGURES]
            continue
        for fig in FIGURES:
            values = [v for e in entries if (v := fig.value(e)) is not None]
            recent, reference = values[-RECENT:], values[-RECENT - REFERENCE : -RECENT]
            if len(recent) < RECENT or len(reference) < RECENT:
                continue
            judged = stats.judge(
                reference, recent, bound=bounds.get(fig.key), log=fig.log, worse=fig.worse,
                floor=2.0,
            )  # fmt: skip
            found.append(Drift(klass, fig.key, fig.title, judged.verdict, judged.reason))
    return found


def render_markdown(history: History, found: list[Drift]) -> str:
    """The history's section for the job summary: the last night per class, and drift."""
    lines = [f"## dl-ci history: {len(history.entries)} entries", ""]
    rows = []
    for klass, entries in by_class(history).items():
        last = entries[-1]
        for fig in FIGURES:
            value = fig.value(last)
            verdict = next(
                (f for f in found if f.hardware_class == klass and f.figure == fig.key), None
            )
            shown = "-" if value is None else fig.show(value)
            have = sum(fig.value(e) is not None for e in same_tier(entries)[0])
            rows.append(
                [
                    md(klass),
                    fig.title,
                    md(last.date or "?"),
                    shown,
                    md(_trend(verdict, have, len(entries))),
                ]
            )
    lines += [*table(["class", "figure", "last night", "value", "trend"], rows), ""]
    notes = [
        f"{f.hardware_class}: {f.title}: {f.reason}"
        for f in found
        if f.verdict in ("regressed", "inconclusive")
    ]
    notes += sorted(
        {f"{f.hardware_class}: {f.reason}" for f in found if f.verdict == "another tier"}
    )
    if notes:
        lines += [*bullets(md(n) for n in notes), ""]
    lines.append("The trend plot (trend.svg) and history.json are in the history artifact.")
    return "\n".join(lines) + "\n"


def _trend(verdict: Drift | None, have: int = 0, nights: int = 0) -> str:
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
    return "drift" if verdict.verdict == "regressed" else verdict.verdict


def svg(history: History) -> str:
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
        show, value_of = fig.show, fig.value
        top = 20 + row * panel
        bottom = top + panel - 35  # the x axis
        parts.append(f'<text x="{left}" y="{top}" font-weight="bold">{fig.title}</text>')
        parts.append(
            f'<polyline fill="none" stroke="#888" '
            f'points="{left},{top + 10} {left},{bottom} {left + plot},{bottom}"/>'
        )
        values = [v for es in groups.values() for e in es if (v := value_of(e)) is not None]
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
            date = str(longest[i].date or "?")[:10]
            parts.append(
                f'<text x="{x:.1f}" y="{bottom + 16}" text-anchor="middle">'
                f"{html.escape(date)}</text>"
            )
        for color, (klass, entries) in zip(palette * 10, groups.items(), strict=False):
            count = max(len(entries) - 1, 1)
            points = " ".join(
                f"{left + plot * i / count:.1f},"
                f"{top + 15 + (bottom - top - 15) * (1 - (v - low) / span):.1f}"
                for i, e in enumerate(entries)
                if (v := value_of(e)) is not None
            )
            parts.append(f'<polyline fill="none" stroke="{color}" points="{points}"/>')
            parts.append(
                f'<text x="{left + plot + 10}" y="{top + 15 + 14 * list(groups).index(klass)}" '
                f'fill="{color}">{html.escape(klass[:20])}</text>'
            )
    parts.append("</svg>")
    return "\n".join(parts) + "\n"
