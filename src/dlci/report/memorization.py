"""The memorization report: JSON first; the Markdown and the loss-curve PNG are made from it."""

from __future__ import annotations

import platform
import time
from pathlib import Path
from typing import Any

from dlci import __version__
from dlci.report.text import label, md, md_code, table

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
                "time_cap_minutes",
                "batch_size",
                "nproc",
                "ladder_revision",
            )
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
    return {
        "schema_version": SCHEMA_VERSION,
        "kind": "memorization",
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "verdict": result.verdict,
        "reason": result.reason,
        "threshold": tier["max_loss"],
        "config": config,
        "tier": tier,
        "tracking": tracking,
        **{k: v for k, v in result.to_dict().items() if k not in ("hparams", "changes")},
    }


def render_markdown(report: dict[str, Any]) -> str:
    """The job-summary section of a memorization report; its outside text escaped."""
    icon = "✅" if report["verdict"] == "pass" else "❌"
    tier = report["tier"]
    rows = [
        ["target", md_code(report["config"]["target"])],
        ["tier", f"{md(tier['budget'])} / {md(tier['hardware_class'])} ({md(tier['row'])})"],
        [
            "threshold",
            f"loss < {_fmt(report['threshold'], 'g')} within {md(tier['max_epochs'])} epochs, "
            f"{_fmt(tier['time_cap_minutes'], 'g')} min",
        ],
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
    lines = [f"### {icon} Memorization test: {md(report['verdict'])}", "", md(report["reason"]), ""]
    return "\n".join(lines + table(["", ""], rows)) + "\n"


def _fmt(value: Any, spec: str = ".4g") -> str:
    """A number by ``spec``; anything else (a report the pull request's code rewrote) as
    escaped text, never raw and never a crash."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return format(value, spec)
    return md(value)


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
        ax.axhline(
            report["threshold"],
            color="#d62728",
            linestyle="--",
            label=f"threshold {report['threshold']:g}",
        )
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
        import io

        from dlci.fsutil import atomic_write_bytes

        buffer = io.BytesIO()
        fig.savefig(buffer, format="png")
        return atomic_write_bytes(path, buffer.getvalue())
    finally:
        plt.close(fig)
