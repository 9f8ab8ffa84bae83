"""``dlci analyze``: GPU utilization and bottlenecks from a torch.profiler trace."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dlci.commands import _common
from dlci.errors import DlciError


def main(argv: Sequence[str]) -> int:
    p = _common.parser(
        "analyze",
        "Read a Kineto trace (.json or .json.gz, as torch.profiler writes it) in bounded "
        "memory and report GPU utilization (TensorBoard's definition), the temporal breakdown "
        "(Holistic Trace Analysis's), busy time (TraceLens's), a per-step breakdown, the "
        "forward/backward/optimizer/data-loading split, idle gaps, sync points, host-to-device "
        "copies and launch overhead. Definitions: docs/profiling.md.",
    )
    p.add_argument("trace", metavar="TRACE", help="the trace file (.json or .json.gz)")
    _common.add_json(p, "the report (utilization.json)")
    p.add_argument("--markdown", metavar="FILE", help="write the Markdown summary to FILE")
    p.add_argument("--plot", metavar="FILE", help="write the per-step PNG to FILE")
    p.add_argument(
        "--out",
        metavar="DIR",
        help="write utilization.json, utilization.md and utilization.png into DIR",
    )
    p.add_argument(
        "--min-gpu-util",
        type=float,
        metavar="PCT",
        help="fail (exit 1) when GPU utilization is below PCT percent (0-100)",
    )
    p.add_argument(
        "--max-size",
        type=float,
        default=64.0,
        metavar="GIB",
        help="refuse traces larger than this once decompressed (default: 64 GiB)",
    )
    p.add_argument("--quiet", action="store_true", help="print nothing but errors")
    args = p.parse_args(list(argv))
    if args.min_gpu_util is not None and not 0 <= args.min_gpu_util <= 100:
        raise DlciError(
            f"--min-gpu-util must be a percentage from 0 to 100, got {args.min_gpu_util:g}",
            hint="for 40% write --min-gpu-util 40",
        )
    if not args.max_size > 0:
        raise DlciError(f"--max-size must be positive, got {args.max_size:g}")

    report = analyze_file(args.trace, max_size=int(args.max_size * 2**30))
    gate = evaluate_gate(report, args.min_gpu_util)
    if gate is not None:
        report["gate"] = gate
    write_outputs(
        report,
        json_dest=args.json or (str(Path(args.out) / "utilization.json") if args.out else None),
        markdown=args.markdown or (str(Path(args.out) / "utilization.md") if args.out else None),
        plot=args.plot or (str(Path(args.out) / "utilization.png") if args.out else None),
    )
    if not args.quiet and args.json != "-":
        print_summary(report)
    if gate is not None and not gate["passed"]:
        from dlci.report.console import print_error

        print_error(DlciError(gate["message"], hint=gate.get("hint")))
        return 1
    return 0


def analyze_file(trace: str, *, max_size: int | None = None) -> dict[str, Any]:
    from dlci.profiling.metrics import analyze
    from dlci.profiling.reader import DEFAULT_MAX_SIZE, read_trace

    columns = read_trace(trace, max_size=max_size or DEFAULT_MAX_SIZE)
    return analyze(columns, source=str(trace))


def evaluate_gate(report: dict[str, Any], minimum: float | None) -> dict[str, Any] | None:
    """The --min-gpu-util verdict, with the reasons when it fails."""
    if minimum is None:
        return None
    value = report["gpu_utilization_pct"]
    if value is None:
        return {
            "minimum": minimum,
            "value": None,
            "passed": False,
            "message": "the GPU utilization gate cannot be evaluated: the trace has no GPU work",
            "hint": "profile on a GPU runner, or leave out --min-gpu-util on the CPU path",
        }
    passed = value >= minimum
    reasons = [r["finding"] for r in report["recommendations"]]
    message = f"GPU utilization {value:.1f}% is below the minimum of {minimum:g}%"
    if reasons:
        message += ": " + "; ".join(reasons)
    return {
        "minimum": minimum,
        "value": value,
        "passed": passed,
        "message": message if not passed else f"GPU utilization {value:.1f}% >= {minimum:g}%",
        "hint": "see the recommendations in utilization.md" if reasons else None,
    }


def write_outputs(
    report: dict[str, Any],
    *,
    json_dest: str | None,
    markdown: str | None,
    plot: str | None,
) -> None:
    from dlci.fsutil import atomic_write_text
    from dlci.report import utilization

    if json_dest:
        _common.emit_json(report, json_dest)
    if markdown:
        atomic_write_text(markdown, utilization.render_markdown(report, gate=report.get("gate")))
    if plot:
        try:
            utilization.plot(report, Path(plot))
        except ImportError:
            raise DlciError(
                "--plot needs matplotlib, which is not installed",
                hint="pip install 'dl-ci[train]', or leave out --plot",
            ) from None


def print_summary(report: dict[str, Any]) -> None:
    out = sys.stderr
    steps = report["steps"]
    trace = report["trace"]
    print(
        f"analyze: {trace['events']:,} events, {steps['count']} profiled steps "
        f"(mean {steps['mean_step_us'] / 1e3:.2f} ms)",
        file=out,
    )
    if report["gpu_utilization_pct"] is None:
        print("analyze: CPU-only trace, no GPU utilization", file=out)
    for device in report["devices"]:
        tb = device["temporal_breakdown"]
        print(
            f"analyze: GPU {device['device']}: utilization {device['gpu_utilization_pct']:.1f}%, "
            f"busy {device['busy']['busy_pct']:.1f}%, idle {tb['idle_pct']:.1f}% / compute "
            f"{tb['compute_pct']:.1f}% / non-compute {tb['non_compute_pct']:.1f}%",
            file=out,
        )
    phases = report.get("phases", {}).get("pct")
    if phases:
        split = ", ".join(f"{k.replace('_', ' ')} {v:.1f}%" for k, v in phases.items())
        print(f"analyze: host step time: {split}", file=out)
    for rec in report["recommendations"]:
        print(f"analyze: recommendation: {rec['finding']}: {rec['advice']}", file=out)
    for warning in report["warnings"]:
        print(f"analyze: warning: {warning}", file=out)
