"""The doctor's figures: its instruments drawn as people read them, one PNG each.

Every figure is drawn from the report alone (``doctor.json``'s details), so a report read back
draws the same figures; the training examples are the exception, drawn from the target's first
batch while the doctor runs (:func:`examples_figure`). Each figure carries, under its title,
what healthy looks like on it (:data:`HEALTHY`), and the HTML report repeats it.

A figure whose check did not run, or whose details are missing or malformed (a report is
outside input), is not drawn: :func:`doctor_figures` says why in its ``skipped`` list.
The report is read as its classes (:class:`~dlci.report.fields.DoctorReport`); each check's
``details`` stay an open table (the instruments' own data), each value checked as it is drawn.
"""

from __future__ import annotations

import contextlib
import io
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dlci import jsonio
from dlci.fsutil import atomic_write_bytes
from dlci.report.fields import DoctorReport
from dlci.report.text import clean, label

FOLDER = "figures"
#: what each figure shows when training is healthy (a caption on the PNG and in the HTML)
HEALTHY = {
    "lr-range": "healthy: the loss falls as the rate grows, then turns up; the configured rate "
    "sits left of the lowest-loss rate, near the steepest descent",
    "grad-flow": "healthy: every layer gets a gradient, within about two orders of magnitude "
    "of the others; a slope down toward the input is vanishing, up is exploding",
    "update-ratio": "healthy: each layer's update is about 1e-3 of its weights per step "
    "(the shaded band, 1e-4 to 1e-2)",
    "activations": "healthy: few units dead (never active) or saturated (always at a limit); "
    "the dashed line is the warning level",
    "weight-norms": "healthy: norms change by a few percent over the first steps; a line that "
    "keeps climbing is a rate too high or a missing decay",
    "examples": "look before believing any number: do the labels match what you see?",
}
TITLES = {
    "lr-range": "learning-rate range test",
    "grad-flow": "gradient norm per layer (first step)",
    "update-ratio": "update-to-weight ratio per layer",
    "activations": "dead and saturated units per layer",
    "weight-norms": "weight norm per layer over the first steps",
    "examples": "training examples with their labels",
}
MAX_LINES = 12  # lines per over-steps figure: the most moving layers, the rest left out


@dataclass(frozen=True)
class Drawn:
    """One figure drawn: its kind, title, file (relative to the report's folder) and what
    healthy looks like on it."""

    id: str
    title: str
    file: str
    healthy: str


@dataclass
class Figures:
    """What :func:`doctor_figures` drew, and why each figure it did not draw was not."""

    figures: list[Drawn] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)  # kind -> why


def _num(value: Any) -> float | None:
    """A finite float from a report value (a number or a formatted string), else None."""
    if isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _series(value: Any) -> list[float] | None:
    if not isinstance(value, list) or not value:
        return None
    numbers = [_num(v) for v in value]
    return None if any(n is None for n in numbers) else [n for n in numbers if n is not None]


def _per_layer_series(value: Any) -> dict[str, list[float]]:
    """``{layer: [numbers]}`` from a details mapping, hostile entries left out."""
    if not isinstance(value, dict):
        return {}
    return {n: s for n, raw in value.items() if isinstance(n, str) and (s := _series(raw))}


def _per_layer(value: Any) -> dict[str, float]:
    """``{layer: number}`` from a details mapping, hostile entries left out."""
    if not isinstance(value, dict):
        return {}
    out = {}
    for name, raw in value.items():
        number = _num(raw)
        if isinstance(name, str) and number is not None:
            out[name] = number
    return out


def _figure(kind: str, rows: int = 1, *, height: float = 3.6) -> tuple[Any, Any]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(rows, 1, figsize=(8, height), dpi=100)
    fig.suptitle(TITLES[kind], fontsize=11, x=0.01, ha="left")
    fig.text(0.01, 0.005, HEALTHY[kind], fontsize=8, color="#555555", ha="left", va="bottom")
    return fig, ax


def _png(fig: Any) -> bytes:
    import matplotlib.pyplot as plt

    try:
        fig.tight_layout(rect=(0, 0.05, 1, 0.97))
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png")
        return buffer.getvalue()
    finally:
        plt.close(fig)


def _layer_axis(ax: Any, names: list[str]) -> None:
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels([label(n, limit=24) for n in names], rotation=45, ha="right", fontsize=7)
    ax.set_xlabel("layer, input to output")


def _lr_range(details: dict[str, Any]) -> bytes | None:
    lrs, losses = _series(details.get("lrs")), _series(details.get("smoothed_loss"))
    if not lrs or not losses or len(lrs) != len(losses) or min(lrs) <= 0:
        return None
    fig, ax = _figure("lr-range")
    ax.plot(lrs, losses, color="#1f77b4", label="smoothed loss")
    ax.set_xscale("log")
    marks = (
        ("configured", "configured", "#2ca02c", "-"),
        ("steepest", "steepest descent", "#ff7f0e", "--"),
        ("lowest_loss_lr", "lowest loss", "#d62728", ":"),
    )
    for key, name, color, style in marks:
        value = _num(details.get(key))
        if value is not None and value > 0:
            ax.axvline(value, color=color, linestyle=style, label=f"{name} {value:.1e}")
    ax.set_xlabel("learning rate")
    ax.set_ylabel("loss (smoothed)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _png(fig)


def _grad_flow(details: dict[str, Any]) -> bytes | None:
    norms = _per_layer(details.get("grad_norms"))
    if not norms:
        return None
    names = list(norms)  # the model's order of its parameters: input to output
    fig, ax = _figure("grad-flow")
    values = [max(norms[n], 1e-30) for n in names]
    ax.bar(range(len(names)), values, color="#1f77b4")
    ax.set_yscale("log")
    ax.set_ylabel("gradient norm")
    _layer_axis(ax, names)
    ax.grid(alpha=0.3, axis="y")
    return _png(fig)


def _update_ratio(details: dict[str, Any]) -> bytes | None:
    lines = _per_layer_series(details.get("ratio_by_step"))
    median = _per_layer(details.get("median_ratio"))
    if not lines and not median:
        return None
    fig, ax = _figure("update-ratio")
    ax.axhspan(1e-4, 1e-2, color="#2ca02c", alpha=0.12, label="1e-4 to 1e-2")
    ax.axhline(1e-3, color="#2ca02c", linestyle="--", linewidth=1)
    if lines:
        shown = _most_moving(lines, key=lambda s: abs(math.log10(max(_median(s), 1e-30)) + 3))
        for name in shown:
            ax.plot(range(1, len(lines[name]) + 1), [max(v, 1e-30) for v in lines[name]],
                    label=label(name, limit=28))  # fmt: skip
        ax.set_xlabel("step")
        _left_out(ax, len(lines) - len(shown))
    else:
        names = list(median)
        ax.bar(range(len(names)), [max(median[n], 1e-30) for n in names], color="#1f77b4")
        _layer_axis(ax, names)
    ax.set_yscale("log")
    ax.set_ylabel("|update| / |weight|")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    return _png(fig)


def _median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


def _most_moving(lines: dict[str, list[float]], key: Callable[[list[float]], float]) -> list[str]:
    """The MAX_LINES layers that stand out most by ``key``, in the report's (model) order."""
    if len(lines) <= MAX_LINES:
        return list(lines)
    top = set(sorted(lines, key=lambda n: key(lines[n]), reverse=True)[:MAX_LINES])
    return [n for n in lines if n in top]


def _left_out(ax: Any, count: int) -> None:
    if count > 0:
        ax.text(0.99, 0.02, f"{count} steadier layers not drawn", transform=ax.transAxes,
                ha="right", va="bottom", fontsize=7, color="#555555")  # fmt: skip


def _activations(details: dict[str, Any]) -> bytes | None:
    sites = {
        name: site
        for name, site in details.items()
        if isinstance(name, str) and isinstance(site, dict)
    }
    rows = {n: (_num(s.get("dead")), _num(s.get("saturated"))) for n, s in sites.items()}
    rows = {n: r for n, r in rows.items() if r[0] is not None or r[1] is not None}
    if not rows:
        return None
    names = list(rows)
    fig, ax = _figure("activations")
    width = 0.4
    xs = range(len(names))
    ax.bar([x - width / 2 for x in xs], [rows[n][0] or 0.0 for n in names], width, label="dead")
    ax.bar(
        [x + width / 2 for x in xs], [rows[n][1] or 0.0 for n in names], width, label="saturated"
    )
    ax.axhline(0.5, color="#d62728", linestyle="--", linewidth=1)
    ax.set_ylim(0, 1)
    ax.set_ylabel("share of units")
    _layer_axis(ax, names)
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8)
    return _png(fig)


def _weight_norms(details: dict[str, Any]) -> bytes | None:
    lines = _per_layer_series(details.get("norm_by_step"))
    if not lines:
        return None
    fig, ax = _figure("weight-norms")
    shown = _most_moving(lines, key=lambda s: abs(s[-1] / s[0] - 1) if s[0] else math.inf)
    for name in shown:
        values = lines[name]
        start = values[0] or 1.0
        ax.plot(range(len(values)), [v / start for v in values], label=label(name, limit=28))
    _left_out(ax, len(lines) - len(shown))
    ax.set_xlabel("step")
    ax.set_ylabel("norm / its first value")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    return _png(fig)


DRAWERS: dict[str, Callable[[dict[str, Any]], bytes | None]] = {
    "lr-range": _lr_range,
    "grad-flow": _grad_flow,
    "update-ratio": _update_ratio,
    "activations": _activations,
    "weight-norms": _weight_norms,
}


def doctor_figures(report: DoctorReport, folder: str | Path) -> Figures:
    """Draw the report's figures into ``folder``/figures/ and say what was drawn, and why
    each figure that was not drawn was not."""
    checks = {check.id: check for check in report.checks}
    done = Figures()
    for kind, draw in DRAWERS.items():
        check = checks.get(kind)
        if check is None or check.status == "skip":
            why = "the check did not run" if check is None else "the check was skipped"
            done.skipped[kind] = why
            continue
        png = draw(check.details)
        if png is None:
            done.skipped[kind] = "the report holds no figures for it"
            continue
        path = Path(folder) / FOLDER / f"{kind}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(path, png)
        done.figures.append(_entry(kind, path, folder))
    return done


def _entry(kind: str, path: Path, folder: str | Path) -> Drawn:
    return Drawn(kind, TITLES[kind], path.relative_to(folder).as_posix(), HEALTHY[kind])


# ---- the training examples, from the target's first batch ----------------------------------

MAX_EXAMPLES = 16


def examples_figure(
    inputs: Any, labels: Any, folder: str | Path, *, vocab: Any = None
) -> Drawn | None:
    """The first examples of a batch with their labels, as a PNG in ``folder``/figures/:
    images (``(N, C, H, W)`` or ``(N, H, W)``) as a grid, token ids (integer ``(N, L)``) as
    text, decoded when ``vocab`` (a tokenizer with ``decode``, or a sequence of tokens) is
    given, other rows as a table of their first values. None when the batch is none of those."""
    import torch

    if not isinstance(inputs, torch.Tensor) or inputs.ndim < 2 or inputs.shape[0] == 0:
        return None
    x = inputs.detach().cpu()[:MAX_EXAMPLES]
    y = labels.detach().cpu()[: len(x)] if isinstance(labels, torch.Tensor) else None
    if x.is_floating_point() and x.ndim in (3, 4) and min(x.shape[-2:]) >= 4:
        png = _image_grid(x, y)
    elif not x.is_floating_point() and x.ndim == 2:
        png = _token_rows(x, y, vocab)
    elif x.ndim == 2:
        png = _table_rows(x, y)
    else:
        return None
    path = Path(folder) / FOLDER / "examples.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, png)
    # rows of numbers: also as data, so report.html shows them as a table of text, not a picture
    table = path.with_name(EXAMPLES_TABLE)
    if x.ndim == 2 and x.is_floating_point():
        atomic_write_bytes(table, jsonio.encode(_table_data(x, y)))
    elif table.is_file() and not table.is_symlink():
        table.unlink()  # an earlier run's table would stand for this run's examples
    return _entry("examples", path, folder)


EXAMPLES_TABLE = "examples.json"


def _table_data(x: Any, y: Any) -> dict[str, Any]:
    """The first rows and columns of a tabular batch: ``{"columns", "rows"}``, as text."""
    rows = x[:10]
    columns = [f"x{j}" for j in range(min(8, rows.shape[1]))] + ["label"]
    cells = [[f"{v:.3g}" for v in r[:8].tolist()] + [_label_text(y, i)] for i, r in enumerate(rows)]
    return {"columns": columns, "rows": cells, "width": int(x.shape[1])}


def _label_text(y: Any, i: int) -> str:
    if y is None or i >= len(y):
        return "label: none"
    value = y[i]
    if value.numel() == 1:
        return f"label {value.item():g}"
    return "label " + clean(value.flatten()[:6].tolist(), limit=30)


def _image_grid(x: Any, y: Any) -> bytes:
    if x.ndim == 3:
        x = x.unsqueeze(1)
    count = len(x)
    cols = min(8, count)
    rows = math.ceil(count / cols)
    fig, _ = _figure("examples", height=1.6 * rows + 0.9)
    fig.clf()
    fig.suptitle(TITLES["examples"], fontsize=11, x=0.01, ha="left")
    fig.text(0.01, 0.005, HEALTHY["examples"], fontsize=8, color="#555555", ha="left")
    for i in range(count):
        ax = fig.add_subplot(rows, cols, i + 1)
        image = x[i].float()
        image = image[0] if image.shape[0] not in (3,) else image.permute(1, 2, 0)
        low, high = float(image.min()), float(image.max())
        image = (image - low) / (high - low) if high > low else image * 0
        ax.imshow(image.numpy(), cmap="gray" if image.ndim == 2 else None)
        ax.set_title(_label_text(y, i), fontsize=8)
        ax.axis("off")
    return _png(fig)


def _decode(row: list[int], vocab: Any) -> str:
    if vocab is not None and hasattr(vocab, "decode"):
        with contextlib.suppress(Exception):  # a tokenizer of the target's: ids instead
            return str(vocab.decode(row))
    if isinstance(vocab, list | tuple):
        return " ".join(str(vocab[t]) if 0 <= t < len(vocab) else f"<{t}>" for t in row)
    return " ".join(str(t) for t in row)


def _token_rows(x: Any, y: Any, vocab: Any) -> bytes:
    rows = [clean(_decode(r.tolist(), vocab), limit=110) for r in x[:8]]
    fig, ax = _figure("examples", height=0.45 * len(rows) + 1.2)
    ax.axis("off")
    for i, text in enumerate(rows):
        ax.text(0, 1 - (i + 0.5) / len(rows), label(f"{_label_text(y, i)}:  {text}", limit=140),
                fontsize=7, family="monospace", va="center", transform=ax.transAxes)  # fmt: skip
    return _png(fig)


def _table_rows(x: Any, y: Any) -> bytes:
    rows = x[:10]
    cells = [[f"{v:.3g}" for v in r[:8].tolist()] + [_label_text(y, i)] for i, r in enumerate(rows)]
    columns = [f"x{j}" for j in range(min(8, rows.shape[1]))] + ["label"]
    fig, ax = _figure("examples", height=0.3 * len(cells) + 1.2)
    ax.axis("off")
    ax.table(cellText=cells, colLabels=columns, loc="center", fontsize=7)
    return _png(fig)
