"""calibration.md: the proposal next to the current rows, the power table, the seeds.

Made from calibration.json alone; the nightly workflow appends it to the job summary, so a
team sees when its ladder drifts from what its model now needs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dlci.report.text import md, md_code, table


def _pct(value: float | None, bound: bool = False) -> str:
    """A rate in percent; None (not estimable) as n/a.

    >>> _pct(0.0123), _pct(None), _pct(0.17, bound=True), _pct(2e-9, bound=True)
    ('1.23%', 'n/a', '<= 17%', '< 0.0001%')
    """
    if value is None:
        return "n/a"
    if value < 1e-6:
        return "< 0.0001%"
    text = f"{value * 100:.3g}%"
    return f"<= {text}" if bound else text


def _row_cells(label: str, row: dict[str, Any], seeds: int) -> list[str]:
    slowdown = row.get("detectable_slowdown")
    if slowdown is None and row.get("median_epochs"):
        slowdown = row["max_epochs"] / row["median_epochs"]
    return [
        label,
        f"{row['max_relative_loss']:g}",
        str(row["max_epochs"]),
        f"{row['time_cap_minutes']:g} min",
        _pct(row["estimated_rate"]),
        _pct(row["upper_bound"], bound=True),
        f"{_pct(row['distribution_free_upper_bound'], bound=True)} "
        f"({row['failures']}/{seeds} failed)",
        f"{slowdown:.2f}x" if slowdown else "n/a",
    ]


def _budgets(report: dict[str, Any]) -> list[str]:
    seeds = len(report["seeds"])
    rows = []
    for budget, entry in report["budgets"].items():
        rows.append(
            [
                md(budget),
                *_row_cells(f"current ({md(entry['current']['row'])})", entry["current"], seeds),
            ]
        )
        if entry["proposal"]:
            rows.append([md(budget), *_row_cells("**proposed**", entry["proposal"], seeds)])
        else:
            rows.append([md(budget), "**no proposal**", *[""] * 7])
    headers = [
        "budget",
        "row",
        "max_relative_loss",
        "max_epochs",
        "time cap",
        "healthy failures (estimate)",
        f"bound ({report['confidence']:.0%})",
        "distribution-free bound",
        "slowdown it catches",
    ]
    return table(headers, rows)


def _power(report: dict[str, Any]) -> list[str]:
    if not report["power"]:
        return ["No power table (--power-seeds 0)."]
    budgets = list(report["budgets"])
    headers = ["variant", *[f"{md(b)} {k}" for b in budgets for k in ("current", "proposed")]]
    rows = []
    for entry in report["power"]:
        cells = [md(entry["what"])]
        for budget in budgets:
            judged = entry["budgets"][budget]
            cells += [_verdicts(judged.get(k)) for k in ("current", "proposed")]
        rows.append(cells)
    return table(headers, rows)


def _verdicts(judged: list[dict[str, Any] | None] | None) -> str:
    """How a row treats one variant's seeds: caught (at which epoch) or missed.

    >>> _verdicts([{"caught": True, "epoch": 20, "how": "epochs"}, None])
    'caught 1/1 (at epoch 20); n/a 1'
    >>> _verdicts([{"caught": False, "epoch": 6, "how": "passed"}])
    'missed 1/1 (passes at epoch 6)'
    """
    if judged is None:
        return ""
    runs = [j for j in judged if j is not None]
    caught = [j for j in runs if j["caught"]]
    missed = [j for j in runs if not j["caught"]]
    parts = []
    if caught:
        epochs = ", ".join(str(j["epoch"]) for j in caught)
        parts.append(f"caught {len(caught)}/{len(runs)} (at epoch {epochs})")
    if missed:
        epochs = ", ".join(str(j["epoch"]) for j in missed)
        parts.append(f"missed {len(missed)}/{len(runs)} (passes at epoch {epochs})")
    if len(runs) < len(judged):
        parts.append(f"n/a {len(judged) - len(runs)}")
    return "; ".join(parts)


def _seeds(report: dict[str, Any]) -> list[str]:
    proposed = {b: e for b, e in report["budgets"].items() if e["proposal"]}
    headers = [
        "seed",
        *[
            f"{md(b)}: epochs to {e['proposal']['max_relative_loss']:g}"
            for b, e in proposed.items()
        ],
    ]
    headers += ["best loss", "steps"]
    rows = []
    for index, run in enumerate(report["runs"]):
        finite = [v for v in run["losses"] if isinstance(v, float | int)]
        cells = [str(run["seed"])]
        cells += [str(e["epochs_to_threshold"][index]) for e in proposed.values()]
        cells += [f"{min(finite):.3g}" if finite else "n/a", str(run["steps"])]
        rows.append(cells)
    return table(headers, rows)


def render_markdown(report: dict[str, Any], files: dict[str, Path]) -> str:
    """The calibration as Markdown; its outside text escaped."""
    seeds = report["seeds"]
    lines = [
        f"### Calibration of {md_code(report['target'])} on class {md(report['hardware_class'])}",
        "",
        f"{len(seeds)} seeds ({seeds[0]} to {seeds[-1]}), up to {report['epochs_ceiling']} epochs "
        f"each on a batch of {report['batch_size']}, on {md(report['device'])} (torch "
        f"{md(report['versions']['torch'])}); {report['workers']} worker(s), "
        f"{report['wall_time_s']:.1f} s. Target: at most {_pct(report['false_failure_rate'])} "
        f"of healthy runs fail, at {report['confidence']:.0%} confidence.",
        "",
        *_budgets(report),
        "",
        "The estimate and its bound assume log-normal epochs to threshold across seeds; the "
        "distribution-free bound assumes nothing and needs many seeds to be small "
        f"({_needed(report)}). A change that makes learning slower than the last column fails "
        "the gate. docs/calibration.md explains the method.",
        "",
        "#### Power: sabotaged variants of the same target",
        "",
        *_power(report),
        "",
        "#### Seeds",
        "",
        *_seeds(report),
    ]
    if report["warnings"]:
        lines += ["", "#### Warnings", ""] + [f"- {md(w)}" for w in report["warnings"]]
    lines += ["", f"Files: {', '.join(md_code(p.name) for p in files.values())}."]
    return "\n".join(lines) + "\n"


def _needed(report: dict[str, Any]) -> str:
    needed = [e["proposal"]["seeds_needed"] for e in report["budgets"].values() if e["proposal"]]
    if not needed:
        return "no row was proposed"
    return (
        f"{max(needed)} seeds, all passing, would bound it by {_pct(report['false_failure_rate'])}"
    )
