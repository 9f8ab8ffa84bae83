"""The memorization report: JSON first; the Markdown and the loss-curve PNG are made from it.

The report is a :class:`~dlci.report.fields.Memorization` from :func:`build_report` to every
reader: a memorization.json read back (the host's copy, a script-mode child's answer, a
baseline's) becomes one through :func:`read`, which names a field of the wrong type before
anything reads it.
"""

from __future__ import annotations

import io
import math
import platform
import time
from pathlib import Path
from typing import Any

import msgspec
from msgspec import UNSET, UnsetType

from dlci import __version__
from dlci.fsutil import atomic_write_bytes
from dlci.report import fields
from dlci.report.fields import Hardware, Memorization, RunConfig, SeedRuns, TierEntry
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


def read(raw: Any) -> Memorization:
    """A decoded memorization.json as the report's classes; ValueError naming each field of a
    wrong type (fields.problems), or a value no field holds (a number beyond a float).

    A partial report reads, its missing fields at their defaults (:func:`missing` names those
    the Markdown needs).

    >>> read({"verdict": "fail", "best_loss": 2.0}).tier.budget
    ''
    >>> read({"verdict": "fail", "losses": [2.0, "nan"]}).losses
    [2.0, 'nan']
    >>> read({"verdict": 1})
    Traceback (most recent call last):
    ValueError: memorization.json: verdict is a number, expected text
    """
    return fields.read_as("memorization", Memorization, raw)


# what the Markdown shows of a report, which a partial one may lack (every dl-ci writes them)
SECTION_KEYS = (
    "verdict", "reason", "config", "tier", "best_loss", "best_step", "final_loss", "steps",
    "wall_time_s", "setup_time_s", "device", "world_size",
)  # fmt: skip
SECTION_TIER_KEYS = ("budget", "hardware_class", "row", "max_epochs", "time_cap_minutes")
SECTION_CONFIG_KEYS = ("target", "seed", "changes")


def missing(raw: dict[str, Any]) -> list[str]:
    """The fields :func:`render_markdown` shows that a decoded report lacks (its section is
    then incomplete).

    >>> missing({"verdict": "pass", "tier": {"budget": "pr"}})[:3]
    ['reason', 'config', 'best_loss']
    """
    absent = [key for key in SECTION_KEYS if key not in raw]
    for key, needed in (("tier", SECTION_TIER_KEYS), ("config", SECTION_CONFIG_KEYS)):
        part = raw.get(key)
        if isinstance(part, dict):
            absent += [f"{key}.{name}" for name in needed if name not in part]
    return absent


def run_config(*, tier: TierEntry, seed: int, target: str, result: Any) -> RunConfig:
    """What defines a run, for tracking and ``dlci compare-runs``: one place, so both agree."""
    return RunConfig(
        target=target,
        seed=seed,
        tier={key: getattr(tier, key) for key in RUN_TIER_KEYS},
        hardware=Hardware(device=result.device, world_size=result.world_size),
        versions=library_versions(),
        hparams=dict(result.hparams, batch_examples=result.batch_examples),
        changes=list(result.changes),
    )


RUN_TIER_KEYS = (
    "budget", "hardware_class", "max_epochs", "max_loss", "max_relative_loss",
    "time_cap_minutes", "batch_size", "nproc", "ladder_version", "ladder_revision",
)  # fmt: skip


def build_report(
    *,
    result: Any,
    tier: dict[str, Any],
    seed: int,
    target: str,
    gpu_name: str | None,
    tracking: str,
    seeds: SeedRuns | UnsetType = UNSET,
    script_mode: bool | UnsetType = UNSET,
) -> Memorization:
    """The memorization.json document for a run's result (``MemorizeResult``) at ``tier`` (a
    ``Tier.to_dict()``)."""
    entry = msgspec.convert(tier, TierEntry)
    config = run_config(tier=entry, seed=seed, target=target, result=result)
    config.hardware.gpu_name = gpu_name
    data = result.to_dict()  # its losses as JSON writes them ("nan" for NaN)
    return Memorization(
        schema_version=SCHEMA_VERSION,
        kind="memorization",
        created_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        verdict=result.verdict,
        reason=result.reason,
        threshold=entry.max_loss,  # absolute; None when the row is relative only
        relative_threshold=entry.max_relative_loss,
        threshold_form=_form(entry),
        config=config,
        tier=entry,
        tracking=tracking,
        stopped_by=result.stopped_by,
        steps=result.steps,
        best_loss=data["best_loss"],
        best_step=result.best_step,
        final_loss=data["final_loss"],
        losses=data["losses"],
        wall_time_s=result.wall_time_s,
        setup_time_s=result.setup_time_s,
        device=result.device,
        world_size=result.world_size,
        batch_examples=result.batch_examples,
        start_loss=data["start_loss"],
        relative_loss=data["relative_loss"],
        criterion=result.criterion,
        loss_floor=result.loss_floor,
        floor_source=result.floor_source,
        blind_loss=data["blind_loss"],
        measured=list(result.measured),
        draws_replayed=result.draws_replayed,
        judged_on=result.judged_on,
        case=result.case,
        projected_epochs=result.projected_epochs,
        # the command to run next names this run's own target
        next_step=result.next_step.replace("<your target>", target),
        stuck_at=result.stuck_at,
        stack=list(result.stack),
        seeds=seeds,
        script_mode=script_mode,
    )


def _form(tier: TierEntry) -> str:
    """Which thresholds the tier states: relative, absolute or both."""
    if tier.max_loss is None:
        return "relative"
    return "both" if tier.max_relative_loss is not None else "absolute"


def render_markdown(report: Memorization) -> str:
    """The job-summary section of a memorization report; its outside text escaped."""
    icon = "✅" if report.verdict == "pass" else "❌"
    tier = report.tier
    rows = [
        ["target", md_code(report.config.target)],
        ["tier", f"{md(tier.budget)} / {md(tier.hardware_class)} ({md(tier.row)})"],
        [
            "threshold",
            f"{md(_criterion(report))} within "
            f"{md(tier.max_epochs)} epochs, {_fmt(tier.time_cap_minutes, 'g')} min",
        ],
        ["start loss", f"{_fmt(report.start_loss)} at step 1, before any update"],
        ["floor", f"{_fmt(report.loss_floor)} ({md(report.floor_source)})"],
        ["input-blind baseline", _fmt(report.blind_loss)],
        ["best loss", f"{_fmt(report.best_loss)} at step {md(report.best_step)}"],
        ["final loss", f"{_fmt(report.final_loss)} after {md(report.steps)} steps"],
        [
            "training time",
            f"{_fmt(report.wall_time_s, '.2f')} s (set-up before it "
            f"{_fmt(report.setup_time_s, '.2f')} s)",
        ],
        ["device", f"{md(report.device)} x {md(report.world_size)}"],
        ["seed", md(report.config.seed)],
    ]
    rows += [["changed", md(change)] for change in report.config.changes]
    rows += [["measured", md(line)] for line in report.measured[:20]]
    lines = [f"### {icon} Memorization test: {md(report.verdict)}", "", md(report.reason), ""]
    if report.verdict != "pass" and report.next_step:
        lines += [f"**Next:** {md(report.next_step)}", ""]
    return "\n".join(lines + table(["", ""], rows)) + "\n"


def _criterion(report: Memorization) -> str:
    """What memorised means (text.criterion): the report's criterion, or its threshold."""
    return report.criterion or f"loss < {report.threshold}"


def _fmt(value: Any, spec: str = ".4g") -> str:
    """A number by ``spec``; anything else (a report the pull request's code rewrote) as
    escaped text, never raw and never a crash."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return format(value, spec)
    return md(value)


def _threshold_lines(report: Memorization) -> list[tuple[float, str]]:
    """The losses the curve must get below: the absolute threshold and the relative one.

    >>> _threshold_lines(read({"threshold": None, "relative_threshold": 0.25,
    ...                        "start_loss": 2.0}))
    [(0.5, '25% of the start 2 (0.5)')]
    >>> _threshold_lines(read({"threshold": None, "relative_threshold": 0.25, "start_loss": 2.0,
    ...                        "blind_loss": 1.0, "loss_floor": 0.2}))
    [(0.4, '25% of the input-blind baseline 1 above the floor 0.2 (0.4)')]
    """
    lines: list[tuple[float, str]] = []
    absolute = _number(report.threshold)
    if absolute is not None:
        lines.append((absolute, f"threshold {absolute:g}"))
    share, start = _number(report.relative_threshold), _number(report.start_loss)
    floor = _number(report.loss_floor) or 0.0
    blind = _number(report.blind_loss)
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
    """A finite number from a report, or None (a missing value, or text for NaN, draws no
    line)."""
    ok = isinstance(value, int | float) and not isinstance(value, bool) and value == value
    return float(value) if ok and abs(value) != float("inf") else None


def plot_curve(report: Memorization, path: Path) -> Path:
    """The loss per step, the threshold, and the best point, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    losses = [math.nan if v is None else float(v) for v in report.losses]
    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    try:
        steps = list(range(1, len(losses) + 1))
        ax.plot(steps, losses, label="training loss", color="#1f77b4")
        for value, text in _threshold_lines(report):
            ax.axhline(value, color="#d62728", linestyle="--", label=label(text))
        if report.best_step and report.best_loss is not None:
            ax.scatter(
                [report.best_step],
                [float(report.best_loss)],
                color="#2ca02c",
                zorder=3,
                label=f"best {_fmt(report.best_loss)}",
            )
        finite = [v for v in losses if v == v and abs(v) != float("inf")]
        if finite and min(finite) > 0 and max(finite) / min(finite) > 100:
            ax.set_yscale("log")
        tier = report.tier
        ax.set_title(label(f"memorization {report.verdict}: {tier.budget} / {tier.hardware_class}"))
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
