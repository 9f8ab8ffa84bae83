"""calibration.png: every seed's loss curve with each budget's proposed threshold and epoch
limit; beside it, the sabotaged variants' curves against the same lines. Made from
calibration.json; matplotlib is imported only here, when the plot is drawn."""

from __future__ import annotations

import io
import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dlci.calibration.summary import CalibrationReport
from dlci.fsutil import atomic_write_bytes
from dlci.report.text import label

COLOURS = ("#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2")


def _floats(values: Sequence[float | str]) -> list[float]:
    return [float(v) for v in values]


def _limits(ax: Any, report: CalibrationReport) -> None:
    """Each budget's proposal: the threshold (dashed) and the epoch limit (dotted)."""
    for index, (budget, entry) in enumerate(report.budgets.items()):
        row = entry.proposal
        if not row:
            continue
        colour = COLOURS[index % len(COLOURS)]
        text = label(
            f"{budget}: {row.max_relative_loss:.3g} of the start by epoch {row.max_epochs}"
        )
        ax.axhline(row.max_relative_loss, color=colour, linestyle="--", linewidth=1.2, label=text)
        ax.axvline(row.max_epochs, color=colour, linestyle=":", linewidth=1.2)


def _axes(
    ax: Any, title: str, curves: list[tuple[str | None, list[float]]], report: CalibrationReport
) -> None:
    positive = [v for _, c in curves for v in c if math.isfinite(v) and v > 0]
    for name, curve in curves:
        steps = range(1, len(curve) + 1)
        if name is None:
            ax.plot(steps, curve, color="#1f77b4", alpha=0.35, linewidth=0.8)
        else:
            ax.plot(steps, curve, linewidth=1.2, label=label(name))
    _limits(ax, report)
    if positive and max(positive) / min(positive) > 100:
        ax.set_yscale("log")
    ax.set_title(label(title))
    ax.set_xlabel("epoch (one step over the memorized batch)")
    ax.set_ylabel("training loss")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)


def plot(report: CalibrationReport, path: Path) -> Path:
    """Draw the PNG (see the module docstring) and write it atomically."""
    import matplotlib

    # a log axis's tick labels ask for mathtext fonts a slim install lacks: matplotlib falls
    # back to DejaVu Sans, and says so once per font on standard error
    logging.getLogger("matplotlib.font_manager").setLevel(logging.ERROR)
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    seeds: list[tuple[str | None, list[float]]] = [
        (None, _floats(run.losses)) for run in report.runs
    ]
    variants: list[tuple[str | None, list[float]]] = [
        (entry.what, _floats(entry.runs[0].losses))
        for entry in report.power
        if entry.runs and entry.runs[0].losses
    ]
    panels = 2 if variants else 1
    fig, axes = plt.subplots(1, panels, figsize=(6.5 * panels, 4.5), dpi=100, squeeze=False)
    try:
        title = f"{len(seeds)} seeds of {report.target} ({report.hardware_class})"
        _axes(axes[0][0], title, seeds, report)
        if variants:
            _axes(axes[0][1], "sabotaged variants (first power seed)", variants, report)
        fig.tight_layout()
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png")
        return atomic_write_bytes(path, buffer.getvalue())
    finally:
        plt.close(fig)
