"""The utilization report's Markdown and PNG, drawn from its JSON and nothing else."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

REPORT_NAME = "utilization.json"
MARKDOWN_NAME = "utilization.md"
PLOT_NAME = "utilization.png"

BREAKDOWN_LABELS = {
    "kernel": "kernel",
    "memcpy": "memcpy",
    "memset": "memset",
    "communication": "communication",
    "runtime": "runtime",
    "data_loading": "data loading",
    "cpu_exec": "CPU exec",
    "other": "other",
}
PHASE_LABELS = {
    "data_loading": "data loading",
    "forward": "forward",
    "backward": "backward",
    "optimizer": "optimizer",
    "other": "other",
}


def _ms(us: float) -> str:
    return f"{us / 1e3:.2f} ms" if us >= 100 else f"{us:.1f} us"


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f}%"


def render_markdown(report: dict[str, Any], *, gate: dict[str, Any] | None = None) -> str:
    """The job-summary section of one utilization report."""
    lines: list[str] = []
    trace = report["trace"]
    steps = report["steps"]
    title = "### Trace profile"
    if trace["cpu_only"]:
        title += " (CPU-only trace: no GPU work recorded)"
    lines.append(title)
    lines.append("")
    if gate is not None:
        mark = "passed" if gate["passed"] else "FAILED"
        lines.append(
            f"**GPU utilization gate {mark}**: {_pct(gate['value'])} against a minimum of "
            f"{gate['minimum']:g}%."
        )
        lines.append("")
    lines.append("| metric | value | definition |")
    lines.append("| --- | --- | --- |")
    lines.append(
        f"| steps profiled | {steps['count']} (mean {_ms(steps['mean_step_us'])}) | "
        "ProfilerStep#N markers, ends moved to the end of their device work |"
    )
    for device in report["devices"]:
        name = f"GPU {device['device']}" + (f" ({device['name']})" if device.get("name") else "")
        tb = device["temporal_breakdown"]
        lines.append(
            f"| {name} utilization | {_pct(device['gpu_utilization_pct'])} | kernels within "
            "the profiled steps' span (TensorBoard profiler) |"
        )
        lines.append(
            f"| {name} busy | {_pct(device['busy']['busy_pct'])} | kernels, memcpy and memset "
            "over first-to-last device event (TraceLens) |"
        )
        lines.append(
            f"| {name} idle / compute / non-compute | {tb['idle_pct']:.1f}% / "
            f"{tb['compute_pct']:.1f}% / {tb['non_compute_pct']:.1f}% | temporal breakdown "
            "(Holistic Trace Analysis) |"
        )
    syncs = report["syncs"]
    lines.append(
        f"| blocking syncs | {syncs['count']} ({syncs['per_step']:g} per step), "
        f"{_ms(syncs['wait_us'])} waited | host calls that wait for the device |"
    )
    lines.append("")

    for key, title, labels in (
        ("breakdown", "Step time breakdown", BREAKDOWN_LABELS),
        ("phases", "Where host step time goes", PHASE_LABELS),
    ):
        pct = (report.get(key) or {}).get("pct")
        if pct:
            keys = [k for k in labels if k in pct]
            lines += [f"#### {title}", ""]
            lines.append("| " + " | ".join(labels[k] for k in keys) + " |")
            lines.append("|" + " --- |" * len(keys))
            lines += ["| " + " | ".join(f"{pct[k]:.1f}%" for k in keys) + " |", ""]

    for device in report["devices"]:
        gaps = device["idle_gaps"][:5]
        if gaps:
            lines.append(f"#### Largest idle gaps on GPU {device['device']}")
            lines.append("")
            lines.append("| at | length | cause | CPU op running |")
            lines.append("| --- | --- | --- | --- |")
            for gap in gaps:
                op = gap["cpu_op"]["name"] if gap["cpu_op"] else "(none)"
                lines.append(
                    f"| {_ms(gap['start_us'])} | {_ms(gap['duration_us'])} | {gap['cause']} "
                    f"| `{_cell(op)}` |"
                )
            lines.append("")
        copies = device["copies"]
        if any(copies[k]["count"] for k in ("h2d_pageable", "h2d_pinned", "h2d_other")):
            lines.append(f"#### Host-to-device copies on GPU {device['device']}")
            lines.append("")
            lines.append("| memory | copies | bytes | time | bandwidth | not hidden |")
            lines.append("| --- | --- | --- | --- | --- | --- |")
            for key, label in (
                ("h2d_pageable", "pageable"),
                ("h2d_pinned", "pinned"),
                ("h2d_other", "other"),
            ):
                c = copies[key]
                if c["count"]:
                    lines.append(
                        f"| {label} | {c['count']} | {c['bytes']:,} | {_ms(c['time_us'])} | "
                        f"{c['bandwidth_gbps']:.1f} GB/s | {_ms(c['exposed_us'])} |"
                    )
            lines.append("")
    if syncs["by_call"]:
        lines.append("#### Sync points")
        lines.append("")
        lines.append("| host call | made by | count | waited | longest |")
        lines.append("| --- | --- | --- | --- | --- |")
        for row in syncs["by_call"][:8]:
            lines.append(
                f"| `{_cell(row['call'])}` | `{_cell(row['caller'])}` | {row['count']} | "
                f"{_ms(row['wait_us'])} | {_ms(row['max_wait_us'])} |"
            )
        lines.append("")
    advice = [f"**{rec['finding']}**: {rec['advice']}." for rec in report["recommendations"]]
    for title, items in (("Recommendations", advice), ("Warnings", report["warnings"])):
        if items:
            lines += [f"#### {title}", "", *(f"- {item}" for item in items), ""]
    return "\n".join(lines)


def _cell(text: str) -> str:
    text = text.replace("|", "\\|").replace("`", "'").replace("\n", " ")
    return text if len(text) <= 80 else text[:77] + "..."


def plot(report: dict[str, Any], path: Path) -> Path:
    """Per-step timeline: stacked breakdown bars and GPU utilization, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from dlci.fsutil import atomic_write_bytes

    per_step = report["per_step"]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6), dpi=100, sharex=True)
    try:
        if per_step:
            x = list(range(len(per_step)))
            labels = [str(s["step"]) for s in per_step]
            bottoms = [0.0] * len(per_step)
            for key, label in BREAKDOWN_LABELS.items():
                values = [s["breakdown"].get(f"{key}_us", 0.0) / 1e3 for s in per_step]
                if any(values):
                    top.bar(x, values, bottom=bottoms, label=label)
                    bottoms = [b + v for b, v in zip(bottoms, values, strict=True)]
            top.set_ylabel("step time (ms)")
            top.set_ylim(0, max(max(bottoms), 1e-9) * 1.45)  # room for the legend
            top.legend(fontsize="small", ncol=4, loc="upper left")
            util = [s["gpu_utilization_pct"] for s in per_step]
            if any(u is not None for u in util):
                bottom.plot(x, [u or 0.0 for u in util], marker="o")
                bottom.set_ylim(0, 100)
                bottom.set_ylabel("GPU utilization (%)")
            else:
                phases = [
                    100.0 * s["phases"].get("data_loading_us", 0.0) / s["host_duration_us"]
                    if s["host_duration_us"]
                    else 0.0
                    for s in per_step
                ]
                bottom.plot(x, phases, marker="o", color="#ff7f0e")
                bottom.set_ylabel("data loading (% of step)")
                bottom.set_ylim(0, 100)
            bottom.set_xticks(x, labels)
            bottom.set_xlabel("profiler step")
        else:
            top.text(0.5, 0.5, "no ProfilerStep markers in the trace", ha="center")
        title = "trace profile"
        if report["gpu_utilization_pct"] is not None:
            title += f": GPU utilization {report['gpu_utilization_pct']:.1f}%"
        else:
            title += " (CPU-only)"
        top.set_title(title)
        for ax in (top, bottom):
            ax.grid(alpha=0.3)
        fig.tight_layout()
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png")
    finally:
        plt.close(fig)
    return atomic_write_bytes(path, buffer.getvalue())


def compare(base: dict[str, Any], head: dict[str, Any], max_regression: float) -> dict[str, Any]:
    """What got worse from BASE to HEAD, and whether it is beyond the bound.

    Utilization is compared in percentage points, step time in percent of BASE's.

    >>> base = {"gpu_utilization_pct": 80.0, "steps": {"mean_step_us": 1000.0}}
    >>> head = {"gpu_utilization_pct": 70.0, "steps": {"mean_step_us": 1020.0}}
    >>> result = compare(base, head, 5.0)
    >>> result["passed"], [r["metric"] for r in result["regressions"]]
    (False, ['gpu_utilization_pct'])
    """
    rows = []
    regressions = []
    b_util, h_util = base.get("gpu_utilization_pct"), head.get("gpu_utilization_pct")
    if b_util is not None and h_util is not None:
        drop = b_util - h_util
        row = {
            "metric": "gpu_utilization_pct",
            "base": b_util,
            "head": h_util,
            "change": round(-drop, 4),
            "unit": "percentage points",
            "regressed": drop > max_regression,
        }
        rows.append(row)
        if row["regressed"]:
            regressions.append(row)
    b_step = base.get("steps", {}).get("mean_step_us") or 0.0
    h_step = head.get("steps", {}).get("mean_step_us") or 0.0
    if b_step > 0 and h_step > 0:
        change = 100.0 * (h_step - b_step) / b_step
        row = {
            "metric": "mean_step_us",
            "base": b_step,
            "head": h_step,
            "change": round(change, 4),
            "unit": "percent",
            "regressed": change > max_regression,
        }
        rows.append(row)
        if row["regressed"]:
            regressions.append(row)
    for metric, getter in (
        ("data_loading_pct", lambda r: r.get("phases", {}).get("pct", {}).get("data_loading")),
        ("syncs_per_step", lambda r: r.get("syncs", {}).get("per_step")),
    ):
        b, h = getter(base), getter(head)
        if b is not None and h is not None:
            rows.append(
                {
                    "metric": metric,
                    "base": b,
                    "head": h,
                    "change": round(h - b, 4),
                    "unit": "informational",
                    "regressed": False,
                }
            )
    return {
        "schema_version": 1,
        "kind": "utilization-diff",
        "max_regression": max_regression,
        "compared": len([r for r in rows if r["unit"] != "informational"]),
        "passed": not regressions,
        "rows": rows,
        "regressions": regressions,
    }


def render_diff_markdown(result: dict[str, Any]) -> str:
    verdict = "passed" if result["passed"] else "FAILED"
    lines = [
        f"### Utilization diff {verdict} (bound {result['max_regression']:g})",
        "",
        "| metric | base | head | change |",
        "| --- | --- | --- | --- |",
    ]
    for row in result["rows"]:
        unit = {"percentage points": " pp", "percent": "%"}.get(row["unit"], "")
        flag = " **regressed**" if row["regressed"] else ""
        lines.append(
            f"| {row['metric']} | {row['base']:.4g} | {row['head']:.4g} | "
            f"{row['change']:+.2f}{unit}{flag} |"
        )
    lines.append("")
    return "\n".join(lines)
