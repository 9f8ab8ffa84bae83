"""The memorization report: JSON first; the Markdown and the loss-curve PNG are made from it."""

from __future__ import annotations

import io
import platform
import time
from pathlib import Path
from typing import Any

from dlci import __version__
from dlci.fsutil import atomic_write_bytes
from dlci.report.text import criterion, label, md, md_code, table

SCHEMA_VERSION = 1
REPORT_NAME = "memorization.json"
CURVE_NAME = "memorization-curve.png"


def library_versions() -> dict[str, str | None]:
    """Versions that change what a training run does."""
    import torch

    versions: dict[str, str | None] = {
        "dlci": __version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": _cudnn_version(torch),
    }
    try:
        import numpy

        versions["numpy"] = numpy.__version__
    except ImportError:  # pragma: no cover
        versions["numpy"] = None
    return versions


def _cudnn_version(torch: Any) -> str | None:
    cudnn = torch.backends.cudnn
    return str(cudnn.version()) if cudnn.is_available() else None


def run_config(*, tier: dict[str, Any], seed: int, target: str, result: Any) -> dict[str, Any]:
    """What defines a run, for tracking and ``dlci compare-runs``: one place, so both agree."""
    return {
        "target": target,
        "seed": seed,
        "tier": {
            k: tier[k]
            for k in (
                "budget",
                "hardware_class",
                "max_epochs",
                "max_loss",
                "max_relative_loss",
                "time_cap_minutes",
                "batch_size",
                "nproc",
                "ladder_version",
                "ladder_revision",
            )
            if k in tier
        },
        "hardware": {"device": result.device, "world_size": result.world_size},
        "versions": library_versions(),
        "hparams": dict(result.hparams, batch_examples=result.batch_examples),
        "changes": list(result.changes),
    }


def build_report(
    *,
    result: Any,
    tier: dict[str, Any],
    seed: int,
    target: str,
    gpu_name: str | None,
    tracking: str,
) -> dict[str, Any]:
    config = run_config(tier=tier, seed=seed, target=target, result=result)
    config["hardware"]["gpu_name"] = gpu_name
    results = {k: v for k, v in result.to_dict().items() if k not in ("hparams", "changes")}
    if results.get("next_step"):  # the command to run next names this run's own target
        results["next_step"] = results["next_step"].replace("<your target>", target)
    return {
        "schema_version": SCHEMA_VERSION,
        "kind": "memorization",
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "verdict": result.verdict,
        "reason": result.reason,
        "threshold": tier.get("max_loss"),  # absolute; None when the row is relative only
        "relative_threshold": tier.get("max_relative_loss"),
        "threshold_form": _form(tier),
        "config": config,
        "tier": tier,
        "tracking": tracking,
        **results,
    }


def _form(tier: dict[str, Any]) -> str:
    """Which thresholds the tier states: relative, absolute or both."""
    relative = tier.get("max_relative_loss") is not None
    if tier.get("max_loss") is None:
        return "relative"
    return "both" if relative else "absolute"


def render_markdown(report: dict[str, Any]) -> str:
    """The job-summary section of a memorization report; its outside text escaped."""
    icon = "✅" if report["verdict"] == "pass" else "❌"
    tier = report["tier"]
    rows = [
        ["target", md_code(report["config"]["target"])],
        ["tier", f"{md(tier['budget'])} / {md(tier['hardware_class'])} ({md(tier['row'])})"],
        [
            "threshold",
            f"{md(criterion(report, 'threshold'))} within "
            f"{md(tier['max_epochs'])} epochs, {_fmt(tier['time_cap_minutes'], 'g')} min",
        ],
        ["start loss", f"{_fmt(report.get('start_loss'))} at step 1, before any update"],
        ["floor", f"{_fmt(report.get('loss_floor'))} ({md(report.get('floor_source', ''))})"],
        ["input-blind baseline", _fmt(report.get("blind_loss"))],
        ["best loss", f"{_fmt(report['best_loss'])} at step {md(report['best_step'])}"],
        ["final loss", f"{_fmt(report['final_loss'])} after {md(report['steps'])} steps"],
        [
            "training time",
            f"{_fmt(report['wall_time_s'], '.2f')} s (set-up before it "
            f"{_fmt(report['setup_time_s'], '.2f')} s)",
        ],
        ["device", f"{md(report['device'])} x {md(report['world_size'])}"],
        ["seed", md(report["config"]["seed"])],
    ]
    rows += [["changed", md(change)] for change in report["config"]["changes"]]
    measured = report.get("measured")
    if isinstance(measured, list):
        rows += [["measured", md(line)] for line in measured[:20]]
    lines = [f"### {icon} Memorization test: {md(report['verdict'])}", "", md(report["reason"]), ""]
    if report["verdict"] != "pass" and report.get("next_step"):
        lines += [f"**Next:** {md(report['next_step'])}", ""]
    return "\n".join(lines + table(["", ""], rows)) + "\n"


def _fmt(value: Any, spec: str = ".4g") -> str:
    """A number by ``spec``; anything else (a report the pull request's code rewrote) as
    escaped text, never raw and never a crash."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return format(value, spec)
    return md(value)


def _threshold_lines(report: dict[str, Any]) -> list[tuple[float, str]]:
    """The losses the curve must get below: the absolute threshold and the relative one.

    >>> _threshold_lines({"threshold": None, "relative_threshold": 0.25, "start_loss": 2.0,
    ...                   "tier": {}})
    [(0.5, '25% of the start 2 (0.5)')]
    >>> _threshold_lines({"threshold": None, "relative_threshold": 0.25, "start_loss": 2.0,
    ...                   "blind_loss": 1.0, "loss_floor": 0.2, "tier": {}})
    [(0.4, '25% of the input-blind baseline 1 above the floor 0.2 (0.4)')]
    """
    lines: list[tuple[float, str]] = []
    absolute = _number(report.get("threshold"))
    if absolute is not None:
        lines.append((absolute, f"threshold {absolute:g}"))
    share, start = _number(report.get("relative_threshold")), _number(report.get("start_loss"))
    floor = _number(report.get("loss_floor")) or 0.0
    blind = _number(report.get("blind_loss"))
    if share is not None and start is not None and start > floor:
        reference, what = start, f"the start {start:.4g}"
        if blind is not None and floor < blind < start:
            reference, what = blind, f"the input-blind baseline {blind:.4g}"
        if floor:
            what += f" above the floor {floor:.4g}"
        value = floor + share * (reference - floor)
        lines.append((value, f"{share:.0%} of {what} ({value:.4g})"))
    return lines


def _number(value: Any) -> float | None:
    """A finite number from a report, or None (a missing or hostile value draws no line)."""
    ok = isinstance(value, int | float) and not isinstance(value, bool) and value == value
    return float(value) if ok and abs(value) != float("inf") else None


def plot_curve(report: dict[str, Any], path: Path) -> Path:
    """The loss per step, the threshold, and the best point, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    losses = [float(v) for v in report["losses"]]
    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    try:
        steps = list(range(1, len(losses) + 1))
        ax.plot(steps, losses, label="training loss", color="#1f77b4")
        for value, text in _threshold_lines(report):
            ax.axhline(value, color="#d62728", linestyle="--", label=label(text))
        if report["best_step"]:
            ax.scatter(
                [report["best_step"]],
                [float(report["best_loss"])],
                color="#2ca02c",
                zorder=3,
                label=f"best {_fmt(report['best_loss'])}",
            )
        finite = [v for v in losses if v == v and abs(v) != float("inf")]
        if finite and min(finite) > 0 and max(finite) / min(finite) > 100:
            ax.set_yscale("log")
        tier = report["tier"]
        ax.set_title(
            label(f"memorization {report['verdict']}: {tier['budget']} / {tier['hardware_class']}")
        )
        ax.set_xlabel("step (epoch over the memorized batch)")
        ax.set_ylabel("loss")
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()

        buffer = io.BytesIO()
        fig.savefig(buffer, format="png")
        return atomic_write_bytes(path, buffer.getvalue())
    finally:
        plt.close(fig)
