"""The bisect's answer for people: console lines and Markdown (a job summary's top), from the
answer's classes (dlci.bisect.result.AnswerShape). Every commit subject, author and reason is
outside text: escaped here, once per medium (dlci.report.text).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dlci.bisect.result import AnswerShape, RunShape, SuspectShape
from dlci.report.text import clean, md, md_code, table

ROWS = 60  # tested commits shown, suspects listed, runs per commit: the rest in bisect.json


def figures_text(figures: dict[str, Any]) -> str:
    """A run's figures, briefly.

    >>> figures_text({"case": "flat", "steps": 26, "max_epochs": 60, "relative_loss": 1.0,
    ...               "relative_threshold": 0.1})
    'flat, 26/60 steps, relative loss 1 (goal 0.1)'
    >>> figures_text({"relative_loss": 10**400, "step_time_ms": 2.0})
    '2 ms a step'
    """
    parts = []
    if figures.get("case"):
        parts.append(str(figures["case"]))
    if figures.get("steps") is not None:
        epochs = figures.get("max_epochs")
        parts.append(f"{figures['steps']}{f'/{epochs}' if epochs else ''} steps")
    if _number(figures.get("relative_loss")):
        goal = figures.get("relative_threshold")
        shown = f"relative loss {figures['relative_loss']:.3g}"
        parts.append(shown + (f" (goal {goal:.3g})" if _number(goal) else ""))
    for key, unit in (("gpu_utilization_pct", "% GPU"), ("step_time_ms", " ms a step")):
        if _number(figures.get(key)):
            parts.append(f"{figures[key]:.4g}{unit}")
    if figures.get("status"):
        parts.append(f"{figures['status']} {figures.get('measured') or ''}".strip())
    return ", ".join(parts)


def _number(value: object) -> bool:
    """Whether ``value`` formats as a float: a figure of the container's, which may hold an
    integer no float holds (10**400 crashed the step that prints the answer)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and abs(value) < 1e300


def runs_text(runs: list[RunShape]) -> str:
    """Every run of one commit: purpose, seeds, verdicts."""
    out = []
    for run in runs[:ROWS]:
        seeds = run.seeds
        where = f" seed{'s' if len(seeds) > 1 else ''} {','.join(map(str, seeds))}" if seeds else ""
        near = " near" if run.near else ""
        out.append(f"{run.purpose}{where}: {','.join(run.verdicts)}{near}")
    return "; ".join(out)


def _who(entry: SuspectShape) -> str:
    pull = entry.pull
    if pull and pull.number:
        by = f" by @{pull.author}" if pull.author else ""
        return f"pull request #{pull.number}{by}: {pull.title}"
    if entry.pull_number:
        return f"pull request #{entry.pull_number} (from the commit's subject)"
    return ""


def console_lines(data: AnswerShape) -> list[str]:
    cost = data.cost
    lines = [f"bisect: {clean(data.message)}"]
    for entry in data.candidates[:ROWS] if data.status != "not-reproduced" else []:
        lines.append(f"  {clean(entry.sha[:12])} {clean(entry.subject, limit=100)}")
        lines.append(f"    author {clean(entry.author)}, {clean(entry.date)}")
        if _who(entry):
            lines.append(f"    {clean(_who(entry), limit=200)}")
    lines.append(
        f"  last good: {clean(data.last_good.sha[:12])} {clean(data.last_good.subject, limit=100)}"
    )
    lines.append(
        f"  {cost.gate_runs:d} gate run(s) ({cost.seed_runs:d} seed run(s)) in "
        f"{cost.wall_s:g} s, of at most {cost.max_runs:d} and "
        f"{cost.time_cap_minutes:g} min"
    )
    for tested in data.tested[:ROWS]:
        figures = figures_text(tested.runs[-1].figures)
        lines.append(
            f"  {clean(tested.sha[:12])} {clean(str(tested.verdict).upper()):<4} "
            f"{clean(runs_text(tested.runs), limit=300)}"
            f"{'; ' + clean(figures, limit=300) if figures else ''}"
        )
        if tested.verdict == "skip":
            lines.append(f"      {clean(tested.runs[-1].reason, limit=300)}")
    lines += _more(data.tested, "tested commit(s)")
    return lines


def _more(listed: Sequence[Any], what: str) -> list[str]:
    left = len(listed) - ROWS
    return [f"  ... {left} more {what} in bisect.json"] if left > 0 else []


def markdown(data: AnswerShape) -> str:
    """The answer first (a job summary's top), then every tested commit."""
    status = data.status
    if status == "found" and data.first_bad is not None:  # together (read_answer checks)
        first = data.first_bad
        head = f"### dl-ci bisect: first bad commit {md_code(first.sha[:12])}"
        body = [f"**{md(first.subject, limit=200)}** by {md(first.author, limit=200)}"]
        if _who(first):
            body.append(md(_who(first), limit=300))
    else:
        head = f"### dl-ci bisect: {md(status)}"
        body = [md(data.message, limit=1000)]
        suspects = [
            f"- {md_code(c.sha[:12])} {md(c.subject, limit=200)} by "
            f"{md(c.author, limit=200)}" + (f"; {md(_who(c), limit=300)}" if _who(c) else "")
            for c in data.candidates[:ROWS]
        ] + [md(line.strip()) for line in _more(data.candidates, "suspect(s)")]
        body += ["\n".join(suspects)] if suspects else []
    cost = data.cost
    body.append(
        f"Gate {md_code(data.gate, limit=300)}; last good "
        f"{md_code(data.last_good.sha[:12])}; {cost.gate_runs} gate run(s) "
        f"({cost.seed_runs} seed runs) in {cost.wall_s:g} s."
    )
    rows = [
        [
            md_code(e.sha[:12]),
            md(e.subject, limit=80),
            md(str(e.verdict)),
            md(runs_text(e.runs), limit=300),
            md(figures_text(e.runs[-1].figures) or e.runs[-1].reason, limit=200),
        ]
        for e in data.tested[:ROWS]
    ]
    headers = ["commit", "subject", "verdict", "runs", "figures"]
    more = [md(line.strip()) for line in _more(data.tested, "tested commit(s)")]
    return "\n\n".join([head, *body, "\n".join(table(headers, rows)), *more]) + "\n"
